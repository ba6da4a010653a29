"""Commands for a run on a cluster, around its job: the health sweep each node runs before
the clock, and the status of a run seen from the login node."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from automlperf.cli.common import app, err, out, user_errors


@app.command()
@user_errors
def sweep(
    run_dir: Annotated[Path, typer.Option(help="The run directory (shared filesystem).")],
    gpus: Annotated[int, typer.Option(min=0, help="GPUs the job asked for on each node.")] = 0,
    stage_to: Annotated[Optional[Path], typer.Option(
        help="The node-local folder the data is staged to.")] = None,
    verdict: Annotated[bool, typer.Option(
        help="On the batch host, after every node swept: name the job's nodes that cannot "
             "train, and print the srun options of the nodes to use (those but the bad ones "
             "where the job leaves them out).")] = False,
) -> None:
    """Check this node before the clock: its GPUs (count, driver, ECC errors), the staging
    folder (there, not in memory, with room), the data and the container image; recorded in
    RUN_DIR/health. `automlperf slurm`'s job runs it on every node in one step."""
    from automlperf.runner import health

    if verdict:
        nodes, bad, exclude = health.slurm_verdict(run_dir)
        for line in health.describe(bad, len(nodes), exclude):
            err.print(line, highlight=False)
        print(health.srun_nodes(nodes, bad, exclude))
        return
    record = health.sweep(run_dir, gpus, stage_to)
    said = "can train" if not record["problems"] else "cannot train: " + "; ".join(record["problems"])
    out.print(f"{record['node']}: {said}" + "".join(f" (note: {w})" for w in record["warnings"]),
              highlight=False)


@app.command()
@user_errors
def status(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the status as JSON.")] = False,
) -> None:
    """How a run stands, from any host that sees its run directory (a login node) while its
    job runs: the job and its end, the clock, replicas by state, trials and epochs, the
    score so far and whether the result would be valid, staged nodes, the health sweep's
    verdict. Read through the run's store service, or its store when none answers."""
    from automlperf.runner.status import run_status

    found = run_status(run_dir)
    if as_json:
        print(found.to_json())
        return
    for line in found.lines():
        out.print(line, highlight=False)
