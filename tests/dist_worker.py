"""One rank of the multi-process tests (``test_distributed.py``); not a test module itself.

``python dist_worker.py CONFIG.json``: joins a gloo group (``env://`` under torchrun, else the
config's ``file://`` store), sleeps the config's delay for its rank, loads its kernels with
``opforge.load`` (or through ``opforge.distributed.build_once``), and writes what it got to
``<out>/rank-<RANK>.json`` (with each load's wall-clock start and end). ``"barrier": false`` in the
config: leave without the final barrier (a test that kills a rank: the others must not wait for it).
"""

import json
import os
import sys
import time


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=cfg.get("init_method", "env://"), rank=rank, world_size=world)
    import opforge
    import opforge.distributed

    time.sleep(cfg.get("delay", {}).get(str(rank), 0))
    results = []
    for name, src in cfg["loads"][str(rank)] if str(rank) in cfg["loads"] else cfg["loads"]["*"]:
        start, started = time.monotonic(), time.time()
        try:
            if cfg.get("build_once"):
                mod = opforge.distributed.build_once(lambda n=name, s=src: opforge.load(n, [s]))
            else:
                mod = opforge.load(name, [src])
            results.append({"name": name, "value": mod.value(), "file": mod.__file__})
        except opforge.BuildError as exc:
            results.append({"name": name, "error": str(exc)})
        results[-1].update(seconds=time.monotonic() - start, started=started, ended=time.time())
    with open(os.path.join(cfg["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(results, f)
    if cfg.get("barrier", True):
        dist.barrier()  # nobody leaves while another rank may still need the store
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
