"""``elastic.run(on_stop=...)`` catches the stop signals during the call only: afterwards, returned
or raised, SIGTERM and SIGUSR1 have the handlers they had before (here the defaults)."""
import signal

import hpcreduce
from hpcreduce import elastic

ctx = hpcreduce.init()
state = elastic.State(step=0)


@elastic.run(on_stop=lambda state: None)
def loop(state):
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "not caught during the call"
    state.step += 1
    state.commit()


loop(state)
handlers = [signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)]
assert handlers == [signal.SIG_DFL, signal.SIG_DFL], handlers
print(f"ok handlers restored (rank {ctx.rank})", flush=True)
