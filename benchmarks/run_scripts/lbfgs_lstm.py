"""The shape of pytorch/examples' time_sequence_prediction: LBFGS, 20 closures over a long LSTMCell loop.

Each ``optimizer.step(closure)`` calls the closure up to 20 times (LBFGS's ``max_iter``); every
closure runs two ``LSTMCell`` over a 999-step sequence and back, so one step is ~40 000 small
operators. Sine-wave data is made here (the example reads a file made by another script).
Prints the loss per step; ``--steps`` (default 15, as the example), ``--length`` of the sequence.
"""

import argparse

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
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    for i in range(args.steps):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        print(f"step {i} loss {float(loss):.6f}", flush=True)


if __name__ == "__main__":
    main()
