"""Made tests/data/torch_quoted_frame_name.pt.trace.json.gz (torch 2.13 CPU; gzip -9 of the output).

torch's Python tracer writes a frame's name unescaped: a code object named like a docstring line
(what torch wrote for torchvision/ops/roi_align.py) makes the JSON invalid. Run from tests/data/.
"""

import types

import torch
from torch.profiler import ProfilerActivity, profile


def rotate(x):
    return x.flip(0) * 2


# A code object named like the docstring line torch wrote for torchvision/ops/roi_align.py.
quoted = types.FunctionType(rotate.__code__.replace(co_name='    """'), globals())
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    for _ in range(3):
        quoted(torch.arange(4.0))
prof.export_chrome_trace("torch_quoted_name.json")
