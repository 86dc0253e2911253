"""Steps that call a user function twice and a stdlib one; ``grow=MB`` keeps MB per step alive
(so a tiny --max-memory stops the recording), ``early=MB`` allocates before the first step."""

import json
import sys
import time

import torch

options = dict(word.split("=", 1) for word in sys.argv[1:] if "=" in word)
grow = int(options.get("grow", "0"))
early = int(options.get("early", "0"))
kept = [b"\x01" * (early << 20)] if early else []  # written, so resident
if early:
    time.sleep(0.3)  # the memory watch polls every 50 ms


def scaled_input() -> torch.Tensor:
    return torch.randn(4, 8) * 2


model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(10):
    inputs = scaled_input() + scaled_input()
    json.dumps({"step": step})
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if grow:
        kept.append(b"\x01" * (grow << 20))
        time.sleep(0.2)
print("done")
