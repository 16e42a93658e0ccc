# Sourced by the jobs/*.sbatch training scripts (not run on its own): the checkpoint folder and
# the requeue on a time limit's warning or a preemption, the same in every script.
#
# CKPT_DIR: where the checkpoints go; a job started again over it (requeued) resumes from it.
# Unset: hpcreduce-ckpt-$SLURM_JOB_ID in the submit folder (said on stderr): a requeued job keeps
# its id, so it finds its checkpoints again.
#
# resumable COMMAND...: run COMMAND; a SIGUSR1 or SIGTERM to the batch shell (Slurm's
# --signal=B:USR1@120, scancel --signal=USR1 --batch, a preemption's SIGTERM) goes to it as
# SIGUSR1 (srun and mpirun pass that on to every rank). Exit 75 (every rank stopped at a step
# boundary and checkpointed) requeues the job (scontrol requeue; the script asks for --requeue);
# any other exit after the signal is said and not requeued (it could not resume from where it was).
# Returns COMMAND's exit code.
# SCONTROL_TIMEOUT (default 10 s): the longest any call of a script to the Slurm controller may
# wait (a controller that is down or slow must not hold the job: the scripts go on without it).
CKPT_DIR=${CKPT_DIR:-}
if [ -z "$CKPT_DIR" ]; then
  CKPT_DIR=hpcreduce-ckpt-${SLURM_JOB_ID:-local}
  echo "$0: CKPT_DIR is unset: checkpointing into $CKPT_DIR (this job resumes from it when requeued;" \
       "set CKPT_DIR, on a shared file system, to choose)" >&2
fi

resumable() {
  local code=0 signalled=0
  "$@" &
  local child=$!
  trap 'signalled=1; kill -USR1 "$child" 2>/dev/null || true' USR1 TERM
  while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done
  wait "$child" || code=$?
  trap - USR1 TERM
  if [ -n "${SLURM_JOB_ID:-}" ] && [ "$code" = 75 ]; then
    echo "$0: stopped (exit $code), checkpoints in $CKPT_DIR; requeueing job $SLURM_JOB_ID" \
         "(requeued ${SLURM_RESTART_COUNT:-0} time(s) before)" >&2
    timeout "${SCONTROL_TIMEOUT:-10}" scontrol requeue "$SLURM_JOB_ID" ||
      echo "$0: scontrol requeue $SLURM_JOB_ID failed or took over ${SCONTROL_TIMEOUT:-10} s; requeue it" \
           "yourself (scontrol requeue $SLURM_JOB_ID): its checkpoints are in $CKPT_DIR" >&2
  elif [ "$signalled" = 1 ] && [ "$code" != 0 ]; then
    echo "$0: the job ended on the signal (exit $code) and is not requeued: it could not resume" \
         "from where it was (docs/slurm.md, time limits and preemption)" >&2
  fi
  return "$code"
}
