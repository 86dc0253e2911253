"""Records how it was started, trains a few steps, then ends as asked (see tests/test_run.py).

Arguments are ``key=value`` words (others, even ones that look like traceinsight's options, are
ignored): ``steps=N`` optimizer steps, ``workers=N`` forked DataLoader workers, ``end=`` one of
``ok``, ``exit3``, ``exit-message``, ``raise``, and ``interrupt_at=N`` to Ctrl-C itself at step N.
The record goes to the JSON file named by the PROBE_RECORD environment variable.
"""

import gc
import json
import os
import signal
import sys
import time

record = {
    "argv": sys.argv,
    "name": __name__,
    "path0": sys.path[0],
    "file": __file__,
    "collector": [gc.isenabled(), *gc.get_threshold()],  # `run` leaves it as Python sets it
}
with open(os.environ["PROBE_RECORD"], "w", encoding="utf-8") as record_file:
    json.dump(record, record_file)

options = dict(word.split("=", 1) for word in sys.argv[1:] if "=" in word)
steps = int(options.get("steps", "0"))
workers = int(options.get("workers", "0"))
interrupt_at = int(options.get("interrupt_at", "-1"))
end = options.get("end", "ok")


def train() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(steps * 4, 8), torch.randn(steps * 4, 1))
    loader = DataLoader(data, batch_size=4, num_workers=workers)
    for step, (inputs, targets) in enumerate(loader):
        if step == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does
            time.sleep(5)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trained {steps} steps")


def fail() -> None:
    raise ValueError("the probe failed on purpose")


if steps:
    train()
if end == "exit3":
    sys.exit(3)
if end == "exit-message":
    sys.exit("stopping early: out of patience")
if end == "raise":
    fail()
print("probe done")
