"""Faults the Python tests cause in a file:// store, shared by the test
files and the trainer scripts they run (hf_train.py)."""
import os


def break_dir(d):
    """Make directory d (a job's in a file:// store) a file, at once,
    whatever ckptd is writing in it: later uploads into it fail."""
    for i in range(1000):
        try:
            if os.path.isdir(d):
                os.rename(d, f"{d}.gone{i}")
            os.close(os.open(d, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return
        except OSError:
            continue  # ckptd made it again meanwhile
    raise RuntimeError(f"could not replace {d}")
