"""A tiny Hugging Face Trainer run through ckpt.hf, for test_hf.py:
    hf_train.py SOCKET JOB OUTDIR MAX_STEPS OUT [resume|resume=STEP] [kill_at]
Trains to MAX_STEPS (resuming from ckptd's latest step with "resume", from
STEP with "resume=STEP"), saving every 4 steps through ckptd; with kill_at,
SIGKILLs itself at that step; else writes the final weights and optimizer
state to OUT. $HF_DATA_SEED: the data's seed (default 1)."""
import os
import signal
import sys

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import ckpt.hf
from faults import break_dir  # noqa: E402 (tests/python, this script's directory)

sock, job, outdir, max_steps, out = sys.argv[1:6]
mode = sys.argv[6] if len(sys.argv) > 6 else "-"
resume = mode.startswith("resume")
from_step = int(mode.split("=", 1)[1]) if "=" in mode else "latest"
kill_at = int(sys.argv[7]) if len(sys.argv) > 7 else None


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x, labels=None):
        y = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(int(os.environ.get("HF_DATA_SEED", "1")))
        self.x, self.y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class Kill(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if kill_at is not None and state.global_step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class Break(TrainerCallback):
    """With $HF_BREAK_DIR: at step 5, that directory (the job's in a
    file:// store) becomes a file, so later uploads fail."""
    def on_step_begin(self, args, state, control, **kw):
        d = os.environ.get("HF_BREAK_DIR")
        if d and state.global_step == 5:
            break_dir(d)


torch.manual_seed(0)
args = TrainingArguments(output_dir=outdir, max_steps=int(max_steps), per_device_train_batch_size=4,
                         save_strategy="steps", save_steps=4, logging_steps=1000, report_to=[], use_cpu=True,
                         seed=0, disable_tqdm=True, dataloader_num_workers=0, learning_rate=0.01)
trainer = Trainer(model=Model(), args=args, train_dataset=Data(),
                  callbacks=[ckpt.hf.CkptdCallback(job, socket=sock), Kill(), Break()])
start = ckpt.hf.checkpoint_dir(job, outdir, step=from_step, socket=sock) if resume else None
trainer.train(resume_from_checkpoint=start)
torch.save({"weights": trainer.model.state_dict(), "optim": trainer.optimizer.state_dict(),
            "global_step": trainer.state.global_step, "resumed_from": start,
            "dirs": sorted(n for n in os.listdir(outdir) if n.startswith("checkpoint-"))}, out)
