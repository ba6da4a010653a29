"""Reports: the HTML report of a run, and the comparison of several runs."""
