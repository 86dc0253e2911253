"""A Dataset that walks the Python stack per sample, like torchvision's FakeData seeding each sample.

Each ``__getitem__`` reseeds torch (``torch.manual_seed`` runs a dozen Python functions) and
formats the stack (``traceback.format_stack()``): thousands of Python calls per batch, which a
profile function (``--stacks user``) or torch's tracer (``with_stack``, thousands of
``python_function`` events) makes slow. A small conv net trains on the samples.

Prints ``STEP_MS`` (the median time of a training step, batch included, after 3 steps) and
``LOADER_MS`` (the median time of one batch from the DataLoader, timed alone after training).
``--steps`` (default 20), ``--batch-size`` (default 32).
"""

import argparse
import itertools
import statistics
import time
import traceback

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class WalkingDataset(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        state = torch.get_rng_state()
        torch.manual_seed(index)
        image = torch.randn(3, 32, 32)
        torch.set_rng_state(state)
        depth = len(traceback.format_stack())
        return image, (index + depth) % 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(WalkingDataset(args.steps * args.batch_size), batch_size=args.batch_size)
    steps = [time.perf_counter()]
    fetches = []  # each batch's wait in the loop: from the end of the last step to the loop's body
    fetch_cpu = []  # the same in this thread's CPU time (other work on the machine does not count)
    cpu = [time.thread_time()]
    for step, (images, labels) in enumerate(loader):
        fetches.append(time.perf_counter() - steps[-1])
        fetch_cpu.append(time.thread_time() - cpu[-1])
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter())
        cpu.append(time.thread_time())
        if step % 5 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    print(
        f"STEP_MS {statistics.median(b - a for a, b in itertools.pairwise(steps[3:])) * 1e3:.2f}", flush=True
    )
    # The batches of the loop indices `traceinsight run` records by default (steps 3-7: wait 1,
    # warmup 2, active 5), timed in the loop: a batch made between two steps is slower than one made
    # in a loop of batches alone (1.5-1.65x here, measured), so this is the figure to compare with.
    print(f"FETCH_MS {statistics.median(fetches[3:8]) * 1e3:.2f}", flush=True)
    print(f"FETCH_CPU_MS {statistics.median(fetch_cpu[3:8]) * 1e3:.2f}", flush=True)
    # The loader alone, after training: under `run` nothing records any more (its window was
    # written), so this is the same loader in the same process, without a profiler.
    batches = []
    for count, _ in enumerate(loader):
        batches.append(time.perf_counter())
        if count == 10:
            break
    print(
        f"LOADER_MS {statistics.median(b - a for a, b in itertools.pairwise(batches)) * 1e3:.2f}", flush=True
    )


if __name__ == "__main__":
    main()
