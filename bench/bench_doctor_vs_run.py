"""The doctor's input item against the run it predicts: `automlperf doctor`'s items that the
input item and the short official-shape run need (devices, ceiling, training in the run's
layout, input pipeline, official run), on one folder, then the input item's predicted data
share beside the data share the run's epochs recorded (its data waits over its training
time) and each epoch's.

Run: python bench/bench_doctor_vs_run.py DATA_DIR [--out DIR] [--run-duration 180s]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--out", type=Path, default=Path("/tmp/doctor-vs-run"))
    parser.add_argument("--run-duration", default="180s")
    args = parser.parse_args()
    from automlperf.config import parse_duration
    from automlperf.runner import doctor
    from automlperf.runner.doctor import DoctorRequest, run_doctor
    from automlperf.store import open_store

    wanted = ("devices", "ceiling", "train channels_last", "input pipeline", "official run")
    doctor.ITEMS = [(name, item) for name, item in doctor.ITEMS if name in wanted]
    report = run_doctor(DoctorRequest(args.out, data_dir=args.data_dir,
                                      run_duration_s=parse_duration(args.run_duration)),
                        lambda c: print(f"{c.status:5} {c.name:20} {c.summary}  {c.advice}",
                                        flush=True))
    checks = {c.name: c for c in report.checks}
    loader = checks["input pipeline"].figures
    run_dir = Path(checks["official run"].figures["run_dir"])
    total = json.loads((run_dir / "result.json").read_text())["time_breakdown"]["total"]
    epochs = open_store(run_dir=run_dir).epochs(1)
    out = {"predicted_data_share": loader.get("predicted_data_share"),
           "run_data_share": total["data_wait_s"] / total["training_s"],
           "epoch_data_shares": [round(e.data_share, 3) for e in epochs],
           "epoch_images_per_s": [round(e.images_per_s, 2) for e in epochs],
           "loader_alone_images_per_s": loader.get("alone", {}).get("images_per_s"),
           "beside": loader.get("training"), "headroom": loader.get("headroom"),
           "input_item": checks["input pipeline"].status,
           "seconds": {c.name: c.seconds for c in report.checks}}
    out["difference"] = out["run_data_share"] - (out["predicted_data_share"] or 0.0)
    print(json.dumps(out, indent=1))
    (args.out / "doctor-vs-run.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
