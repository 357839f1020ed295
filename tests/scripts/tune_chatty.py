"""A script that only prints, for the tests of a trial's bounded output log (no training).

    tune_chatty.py flood            # writes lines to stdout forever
    tune_chatty.py lines N          # writes N numbered lines of 100 bytes, then exits with status 3
    tune_chatty.py warn-after-error # prints an error, then a warning with its source line, exits 1
    tune_chatty.py sigkill          # prints a line, then SIGKILLs itself (as the OOM killer would)
"""

import os
import signal
import sys
import warnings

mode = sys.argv[1]
if mode == "flood":
    line = "x" * 1023 + "\n"
    while True:
        sys.stdout.write(line)
elif mode == "lines":
    for i in range(int(sys.argv[2])):
        sys.stdout.write(f"line {i:09d} ".ljust(99, ".") + "\n")
    sys.stdout.flush()
    os._exit(3)
elif mode == "warn-after-error":
    print("error: the dataset shard /data/shard-7 is corrupt", flush=True)
    warnings.warn("this DataLoader setting is deprecated", UserWarning, stacklevel=1)
    sys.stderr.flush()
    os._exit(1)
elif mode == "sigkill":
    print("allocating a very large buffer...", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
