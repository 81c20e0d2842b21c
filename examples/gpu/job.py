"""A GPU shard for shardpool: hold SHARDPOOL_PARAM_GIB of device memory and
run bf16 matrix products for SHARDPOOL_PARAM_SECONDS, then write a result
whose checksum depends only on the shard's parameters.

Usage (argv from shardpool.toml): python3 job.py OUTDIR
Needs PyTorch with CUDA; shardpool sets CUDA_VISIBLE_DEVICES to the GPU it
admitted the shard on.
"""
import json
import os
import sys
import time

out = sys.argv[1]
gib = float(os.environ.get("SHARDPOOL_PARAM_GIB", "1"))
seconds = float(os.environ.get("SHARDPOOL_PARAM_SECONDS", "2"))
seed = int(os.environ.get("SHARDPOOL_PARAM_SEED", "0"))

try:
    import torch
except ImportError:
    sys.exit("job.py: PyTorch is not installed (pip install torch)")
if not torch.cuda.is_available():
    sys.exit("job.py: no CUDA device visible (CUDA_VISIBLE_DEVICES=%r)" % os.environ.get("CUDA_VISIBLE_DEVICES"))

dev = torch.device("cuda")
hold = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=dev)
hold.fill_(1)
g = torch.Generator(device=dev).manual_seed(seed)
a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, generator=g)
b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, generator=g)
start = time.monotonic()
products = 0
while time.monotonic() - start < seconds:
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
    products += 50
# The result depends on the seed only, not on how many products ran.
check = float((a @ b).float().sum().item())
result = {
    "seed": seed,
    "checksum": round(check, 1),
    "device": torch.cuda.get_device_name(0),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "held_bytes": hold.numel(),
    "max_allocated": torch.cuda.max_memory_allocated(),
    "products": products,
    "tflops": round(products * 2 * 4096**3 / (time.monotonic() - start) / 1e12, 1),
}
with open(os.path.join(out, "result.json"), "w") as f:
    json.dump(result, f, indent=1)
print(json.dumps(result))
