"""The shape of pytorch/examples' time_sequence_prediction: LBFGS, 20 closures over a long LSTMCell loop.

Each ``optimizer.step(closure)`` calls the closure up to 20 times (LBFGS's ``max_iter``); every
closure runs two ``LSTMCell`` over a 999-step sequence and back, so one step is ~40 000 small
operators. Sine-wave data is made here (the example reads a file made by another script).
Prints the loss per step, and ``STEP_MS`` (the median step after the first); ``--steps`` (default 15, as the example), ``--length`` of the sequence,
``--max-iter`` closures per step (default 20). Issue 30's shape: ``--max-iter 8 --length 401 --steps 6``.
"""

import argparse
import itertools
import statistics
import time

import numpy as np
import torch
from torch import nn


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--max-iter", type=int, default=20, help="LBFGS closures per step")
    args = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    x = np.empty((100, args.length), np.int64)
    x[:] = np.array(range(args.length)) + np.random.randint(-80, 80, 100).reshape(100, 1)
    data = np.sin(x / 20).astype("float64")
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=args.max_iter)
    steps = [time.perf_counter()]
    for i in range(args.steps):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        steps.append(time.perf_counter())
        print(f"step {i} loss {loss.item():.6f}", flush=True)
    print(
        f"STEP_MS {statistics.median(b - a for a, b in itertools.pairwise(steps[1:])) * 1e3:.2f}", flush=True
    )


if __name__ == "__main__":
    main()
