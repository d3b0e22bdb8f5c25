import functools, json, math, os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
import torch
import common
from blocksparse.torch._norms import launch
from blocksparse.torch._reduce import sum_rows
from blocksparse.ops.norms.configs import layer_norm_config

out = {"device": torch.cuda.get_device_name(), "rows": []}
hbm = common.hbm_bandwidth_gbs()
out["hbm"] = hbm
for n, c in ((4096, 1024), (8192, 1024), (16384, 1024), (4096, 4096)):
    x, dy = (torch.randn(n, c, device="cuda").bfloat16() for _ in range(2))
    g, b = (torch.randn(c, device="cuda").bfloat16() for _ in range(2))
    _, mean, rstd = launch.layer_norm_fwd(x, g, b, axis=1, epsilon=1e-5, relu=False, segments=1)
    nbytes = 3 * n * c * 2
    copies = max(2, math.ceil(4 * 60 * 2**20 / (2 * nbytes)))
    def rot(fn, *ts):
        return common.time_rotating_ms(lambda: [functools.partial(fn, *(t.clone() for t in ts)) for _ in range(copies)])
    full = rot(lambda dy, x: launch.layer_norm_bwd(dy, x, g, b, mean, rstd, axis=1, relu=False, segments=1), dy, x)
    nogb = rot(lambda dy, x: launch.layer_norm_bwd(dy, x, None, None, mean, rstd, axis=1, relu=False, segments=1), dy, x)
    cfg = layer_norm_config(1, c, 2, backward=True)
    P = cfg.programs(n, 1, torch.cuda.get_device_properties(0).multi_processor_count)
    pa, pb = (torch.randn(P, c, device="cuda") for _ in range(2))
    sr = common.time_rotating_ms(lambda: [functools.partial(sum_rows, [(pa, torch.bfloat16), (pb, torch.bfloat16)]) for _ in range(20)])
    cp = rot(lambda x, dy: (x.clone(), dy.clone()), x, dy)
    row = dict(N=n, C=c, P=P, full_us=full * 1e3, no_g_b_us=nogb * 1e3, sum_rows_us=sr * 1e3, copy2_us=cp * 1e3,
               full_hbm=nbytes / full / 1e6 / hbm, no_g_b_hbm=nbytes / nogb / 1e6 / hbm)
    print(json.dumps(row), flush=True)
    out["rows"].append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "ln-bwd-parts.json"), "w"), indent=1)
