"""Toy job for the Slurm harness test.

train mode:  toy_train.py CKPT OUT STEPS   -- one step per second, checkpoint after every step, resume from CKPT.
stamp mode:  toy_train.py --stamp IN OUT   -- record which Slurm job ran this step.
"""
import json
import os
import socket
import sys
import time


def atomic_dump(obj, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def main(argv):
    job = os.environ.get("SLURM_JOB_ID")
    if argv[0] == "--stamp":
        src, out = argv[1], argv[2]
        with open(src) as fh:
            upstream = json.load(fh)
        atomic_dump({"slurm_job_id": job, "host": socket.gethostname(), "upstream": upstream}, out)
        return
    ckpt, out, steps = argv[0], argv[1], int(argv[2])
    state = {"step": 0, "jobs": []}
    if os.path.exists(ckpt):
        with open(ckpt) as fh:
            state = json.load(fh)
    resumed_from = state["step"]
    state["jobs"].append({"slurm_job_id": job, "start_step": resumed_from})
    print(f"train: slurm job {job}, resuming from step {resumed_from}/{steps}", flush=True)
    for step in range(resumed_from, steps):
        time.sleep(1)
        state["step"] = step + 1
        atomic_dump(state, ckpt)
    atomic_dump({"steps": steps, "resumed_from": resumed_from, "slurm_job_id": job, "jobs": state["jobs"]}, out)


if __name__ == "__main__":
    main(sys.argv[1:])
