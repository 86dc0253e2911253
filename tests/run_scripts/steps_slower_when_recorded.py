"""Steps of known wall time: the first four are quick (start-up), the rest take 80 ms (the few ms
that recording costs stay under the warning's 10 %), or 5x that while the profiler records when
the argument says so (a real recording cost, simulated)."""

import sys
import time

import torch

from traceinsight.capture import step

slowed = sys.argv[1:] == ["slowed"]
weights = torch.randn(8, 1)
for iteration in range(14):
    loss = (torch.randn(4, 8) @ weights).pow(2).mean()
    if iteration >= 4:
        recording = torch.autograd._profiler_enabled()
        time.sleep(0.4 if slowed and recording else 0.08)
    step()
