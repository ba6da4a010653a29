"""The dataset layer: where images come from, below the loaders that decode them
(``train/data/``). No torch here.

Two sources:

* ``archive.py``: ImageNet-1k's official ILSVRC-2012 archives, read without extracting them,
  one pass computing their MD5s and the index of their images (``tarstream.py``);
* ``folder.py``: an image folder (ImageFolder's layout, or Kaggle's flat validation folder),
  for unofficial runs and users' own datasets; walked by ``walk.py``.

Then what both give:

* ``index.py``: the index, every image a row of flat arrays (name, label; an archive's
  offset and size), saved once and memory-mapped by every rank;
* ``reader.py``: an image's bytes by its row, in each process (a file per image, or one
  ``pread`` from an archive opened once);
* ``proof.py``: the official proof, the run's own computation: the archives' MD5s against the
  ruleset's published ones, and their identity held in every process that opens them;
* ``shared.py``: the index a run's primary makes once per session for its replicas;
* ``verify.py``: a site's check of an extracted folder against the archives, and its
  layout-free content root.
"""
