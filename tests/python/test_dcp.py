"""torch.distributed.checkpoint through ckptd, on 2 CPU processes over gloo."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

dcp = pytest.importorskip("torch.distributed.checkpoint")
if tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 4):
    pytest.skip("ckpt.dcp needs the StorageWriter and AsyncStager API of torch>=2.4 "
                f"(this is torch {torch.__version__})", allow_module_level=True)


def _state(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(2, 16)).sum().backward()
    opt.step()
    return m, opt


def _worker(rank, world, port, sock, phase, out):
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "client", "python"))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import ckpt.dcp as cd
    try:
        m, opt = _state(0)
        if phase == "save":
            sd = {"model": m.state_dict(), "extra": {"epoch": 5, "tag": "x"}}
            resp = dcp.async_save(sd, storage_writer=cd.Writer("dcp", step=10, socket=sock))
            up = resp.upload_completion if hasattr(resp, "upload_completion") else resp
            up.result()
            dcp.save(sd, storage_writer=cd.Writer("dcp", step=11, socket=sock))
        else:
            m2, _ = _state(1)
            sd = {"model": m2.state_dict(), "extra": {"epoch": 0, "tag": ""}}
            dcp.load(sd, storage_reader=cd.Reader("dcp", step=phase, socket=sock))
            ok = all(torch.equal(sd["model"][k], v) for k, v in m.state_dict().items())
            torch.save({"ok": ok, "extra": sd["extra"]}, f"{out}.{rank}")
    finally:
        cd.close_all()
        dist.destroy_process_group()


def _free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def test_dcp_save_world2_load_world1_and_2(daemon, tmp_path):
    mp.spawn(_worker, args=(2, _free_port(), daemon.sock, "save", str(tmp_path / "r")), nprocs=2)
    import ckpt
    with ckpt.Client(daemon.sock) as c:
        steps = {s["step"]: s for s in c.list("dcp")}
    assert steps[10]["complete"] and steps[10]["world_size"] == 2
    assert steps[11]["complete"]
    for world, step in ((1, 10), (2, 11), (1, 11)):
        out = tmp_path / f"w{world}s{step}"
        mp.spawn(_worker, args=(world, _free_port(), daemon.sock, step, str(out)), nprocs=world)
        for r in range(world):
            res = torch.load(f"{out}.{r}")
            assert res["ok"], (world, step, r)
            assert res["extra"] == {"epoch": 5, "tag": "x"}
