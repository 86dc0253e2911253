"""The shape of pytorch/examples' mnist on torchvision's FakeData, without torchvision.

torchvision does not import beside this torch (PyPI's build is for another one), so the data
pipeline is written here to do the same Python work per sample as ``datasets.FakeData(size,
(1, 28, 28), 10, transform=Compose([ToTensor(), Normalize((0.1307,), (0.3081,))]))``: reseed torch
around each sample, draw the image and the target, turn the image into a PIL image (ToPILImage),
back into a tensor (ToTensor: numpy, view, permute, divide), normalize it (with its ``if`` on a
tensor), and return ``target.item()``. The model and the loop are the example's (two convolutions,
dropout, two linear layers, Adadelta, ``loss.item()`` every ``--log-interval`` batches).

Prints ``STEP_MS`` (the median time of a training step, batch included, after 3 steps) and
``LOADER_MS`` (the median time of one batch from the DataLoader, timed alone after training).
``--steps`` (default 30), ``--batch-size`` (default 64).
"""

import argparse
import itertools
import statistics
import time

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, Dataset


class ToPILImage:
    def __call__(self, tensor: torch.Tensor) -> Image.Image:
        array = tensor.mul(255).byte().numpy()
        return Image.fromarray(np.transpose(array, (1, 2, 0))[:, :, 0], mode="L")


class ToTensor:
    def __call__(self, picture: Image.Image) -> torch.Tensor:
        image = torch.from_numpy(np.array(picture, np.uint8, copy=True))
        image = image.view(picture.size[1], picture.size[0], len(picture.getbands()))
        return image.permute((2, 0, 1)).contiguous().to(dtype=torch.get_default_dtype()).div(255)


class Normalize:
    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = mean, std

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            raise TypeError("expected a float tensor")
        tensor = tensor.clone()
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype)
        std = torch.as_tensor(self.std, dtype=tensor.dtype)
        if (std == 0).any():
            raise ValueError("std evaluated to zero")
        return tensor.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))


class Compose:
    def __init__(self, transforms: list[object]) -> None:
        self.transforms = transforms

    def __call__(self, picture: object) -> object:
        for transform in self.transforms:
            picture = transform(picture)  # type: ignore[operator]
        return picture


class FakeData(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, size: int, transform: Compose) -> None:
        self.size, self.transform = size, transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        state = torch.get_rng_state()
        torch.manual_seed(index)
        image = torch.randn(1, 28, 28)
        target = torch.randint(0, 10, size=(1,), dtype=torch.long)[0]
        torch.set_rng_state(state)
        picture = ToPILImage()(image)
        return self.transform(picture), int(target.item())  # type: ignore[return-value]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = functional.relu(self.conv1(x))
        x = functional.max_pool2d(functional.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(functional.relu(self.fc1(x)))
        return functional.log_softmax(self.fc2(x), dim=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(1)
    transform = Compose([ToTensor(), Normalize((0.1307,), (0.3081,))])
    loader = DataLoader(FakeData(args.steps * args.batch_size, transform), batch_size=args.batch_size)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    model.train()
    steps = [time.perf_counter()]
    fetches = []  # each batch's wait in the loop: from the end of the last step to the loop's body
    fetch_cpu = []  # the same in this thread's CPU time (other work on the machine does not count)
    cpu = [time.thread_time()]
    for batch_idx, (data, target) in enumerate(loader):
        fetches.append(time.perf_counter() - steps[-1])
        fetch_cpu.append(time.thread_time() - cpu[-1])
        optimizer.zero_grad()
        loss = functional.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter())
        cpu.append(time.thread_time())
        if batch_idx % args.log_interval == 0:
            print(f"batch {batch_idx} loss {loss.item():.6f}", flush=True)
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
