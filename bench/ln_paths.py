"""Where an eager (N, C) layer norm's time goes between the launcher and the public op (CUDA graphs)."""
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from blocksparse.torch import layer_norm  # noqa: E402
from blocksparse.torch._norms import launch  # noqa: E402


def leaf(t, grad):
    return t.detach().clone().requires_grad_(grad)


def main():
    out = []
    for n, c in ((16384, 4096), (8192, 8192), (8192, 1024)):
        gen = torch.Generator(device="cuda").manual_seed(n + c)
        x = (2 * torch.randn(n, c, device="cuda", generator=gen) + 0.5).bfloat16()
        g = (1 + 0.5 * torch.randn(c, device="cuda", generator=gen)).bfloat16()
        b = (0.5 * torch.randn(c, device="cuda", generator=gen)).bfloat16()
        cases = {
            "launcher": lambda x, g, b: launch.layer_norm_fwd(x, g, b, axis=1, epsilon=1e-5, relu=False, segments=1),
            "public": lambda x, g, b: layer_norm(x, g, b, axis=1, epsilon=1e-5),
            "torch": lambda x, g, b: F.layer_norm(x, (c,), g, b, 1e-5),
            "clone": lambda x, g, b: x.clone(),
        }
        for rnd in range(2):
            for name, fn in cases.items():
                for grad in (False, True):
                    if name == "clone" and grad:
                        continue
                    ms = common.time_rotating_ms(lambda: [functools.partial(fn, *(leaf(t, grad) for t in (x, g, b)))
                                                          for _ in range(2)])
                    row = dict(N=n, C=c, path=name, requires_grad=grad, round=rnd, us=round(ms * 1e3, 2))
                    print(json.dumps(row), flush=True)
                    out.append(row)
    with open(os.path.join(os.environ.get("OUT", "."), "ln-paths.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=out), f, indent=1)


if __name__ == "__main__":
    main()
