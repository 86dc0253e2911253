"""The shape of the PyTorch DDP tutorial's multigpu_torchrun.py on CPU: gloo, DDP, DistributedSampler.

Run by torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set). Each rank trains a small MLP on its
shard of a random dataset and prints its rank and steps. ``--epochs`` (default 2),
``--batch-size`` (default 32); rank 1 does twice as many matmuls per step, so the ranks' traces
differ (``--uneven``, on by default).
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> None:
        self.rank = int(os.environ["RANK"])
        self.model = DDP(model)
        self.loader = loader
        self.optimizer = optimizer
        self.steps = 0

    def run_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        outputs = self.model(inputs)
        if self.rank == 1:  # uneven work: rank 1's trace has twice the matmuls
            outputs = (
                outputs
                + (
                    inputs @ torch.ones(inputs.shape[1], inputs.shape[1]) @ torch.ones(inputs.shape[1], 1)
                ).mean()
                * 0
            )
        loss = nn.functional.mse_loss(outputs, targets)
        loss.backward()
        self.optimizer.step()
        self.steps += 1

    def train(self, epochs: int) -> None:
        for epoch in range(epochs):
            assert isinstance(self.loader.sampler, DistributedSampler)
            self.loader.sampler.set_epoch(epoch)
            for inputs, targets in self.loader:
                self.run_batch(inputs, targets)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(640, 64), torch.randn(640, 1))
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1))
    trainer = Trainer(model, loader, torch.optim.SGD(model.parameters(), lr=0.01))
    trainer.train(args.epochs)
    print(f"rank {trainer.rank} trained {trainer.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
