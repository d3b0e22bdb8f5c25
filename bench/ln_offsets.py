"""Does where y lies relative to x change an (N, C) layer norm forward's time? (CUDA graphs)"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import common  # noqa: E402
from blocksparse.ops.norms.configs import layer_norm_config  # noqa: E402
from blocksparse.ops.norms.layer_norm import layer_norm_fwd_kernel  # noqa: E402
from blocksparse.torch._backend import sm_count  # noqa: E402


def call(x, g, b, y, mean, rstd, cfg):
    n, c = x.shape
    layer_norm_fwd_kernel[(cfg.programs(n, 1, sm_count(x.device)), 1)](
        x, g, b, y, mean, rstd, n, c, 1e-5, x.stride(0), 1, y.stride(0), 1,
        BN=cfg.BN, BC=cfg.BC, ONE_CHUNK=True, HAS_G=True, HAS_B=True, RELU=False, num_warps=cfg.num_warps)


def main():
    rows = []
    for n, c in ((16384, 4096), (8192, 8192)):
        cfg = layer_norm_config(1, c, 2)
        g = torch.randn(c, device="cuda").bfloat16()
        b = torch.randn(c, device="cuda").bfloat16()
        for rnd in range(2):
            for off_kb in (0, 4, 64, 1024, 2048, 3072):
                def make():
                    fns = []
                    for _ in range(2):
                        x = torch.randn(n, c, device="cuda").bfloat16()
                        buf = torch.empty(n * c + off_kb * 512, device="cuda", dtype=torch.bfloat16)
                        y = buf[off_kb * 512:].view(n, c)
                        mean = torch.empty(n, device="cuda")
                        rstd = torch.empty(n, device="cuda")
                        fns.append(lambda x=x, y=y, mean=mean, rstd=rstd, buf=buf: call(x, g, b, y, mean, rstd, cfg))
                    return fns
                ms = common.time_rotating_ms(make)
                row = dict(N=n, C=c, y_offset_kb=off_kb, round=rnd, us=round(ms * 1e3, 1))
                print(json.dumps(row), flush=True)
                rows.append(row)
                torch.cuda.empty_cache()
    with open(os.path.join(os.environ.get("OUT", "."), "ln-offsets.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
