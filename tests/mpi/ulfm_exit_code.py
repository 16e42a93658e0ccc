"""Under ULFM, once ``end_at_exit`` is armed (``train`` raised): the script's own atexit handler,
registered before, still runs, and ``sys.exit(3)`` still exits 3 (argv[1]: the handler's folder)."""
import atexit
import os
import sys

import hpcreduce
from hpcreduce.runtime.ulfm_exit import end_at_exit

ctx = hpcreduce.init()
atexit.register(lambda: open(os.path.join(sys.argv[1], f"handler-{ctx.rank}"), "w").close())
end_at_exit(ctx)
sys.exit(3)
