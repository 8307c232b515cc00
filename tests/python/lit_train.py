"""A tiny Lightning fit through ckpt.lightning, for test_lightning.py:
    lit_train.py SOCKET JOB DIR EPOCHS OUT [RESUME_PATH]
Trains to EPOCHS (resuming from RESUME_PATH if given), writes the final
weights, optimizer state, global step and best score to OUT, then is killed
(SIGKILL: nothing after the fit may matter)."""
import os
import signal
import sys

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

import ckpt.lightning

sock, job, ckdir, epochs, out = sys.argv[1:6]
resume = sys.argv[6] if len(sys.argv) > 6 else None


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)
model = Model()
mc = ModelCheckpoint(dirpath=ckdir, save_last=True, save_top_k=2, monitor="train_loss", every_n_epochs=1)
trainer = L.Trainer(max_epochs=int(epochs), accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[mc],
                    plugins=[ckpt.lightning.CkptdCheckpointIO(job, socket=sock)])
trainer.fit(model, loader, ckpt_path=resume)
torch.save({"weights": model.state_dict(), "optim": trainer.optimizers[0].state_dict(),
            "global_step": trainer.global_step, "epoch": trainer.current_epoch,
            "best": float(mc.best_model_score)}, out)
sys.stdout.flush()
os.kill(os.getpid(), signal.SIGKILL)
