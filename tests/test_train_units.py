"""Training pieces that need no MPI job: partitioning, state, parameter views, results, config."""
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcreduce.cli import train_cmd
from hpcreduce.cli.main import build_parser
from hpcreduce.ft.faults import FaultConfig
from hpcreduce.ft.inject import parse_kill

from hpcreduce.ps.optimizers import make_optimizer
from hpcreduce.ps.stats import histogram, staleness_summary
from hpcreduce.runtime.files import write_json
from hpcreduce.train import PS, FinalMetrics, TrainConfig, TrainResult
from hpcreduce.train.model import SparseRows
from hpcreduce.train.models import LogisticRegression
from hpcreduce.train.params import batch_view, dense_grads
from hpcreduce.train.results import checksum
from hpcreduce.train.ring.ring_state import TrainState


# partitioning: tests/test_data_shards.py


def test_batch_view_and_dense_grads_round_trip():
    model = LogisticRegression(hash_bits=4)
    params = model.init_params(0)
    params["weights"][:, 0] = np.arange(16)
    batch = {"ids": np.array([[9, 2, 9]]), "label": np.ones(1, np.float32)}
    view = batch_view(model, params, batch)
    assert np.array_equal(view["weights"].ids, [2, 9]) and np.array_equal(view["weights"].values[:, 0], [2, 9])
    assert view["bias"] is params["bias"]
    grads = {"weights": SparseRows(np.array([2, 9]), np.array([[1.5], [-2.0]], np.float32)),
             "bias": np.ones(1, np.float32)}
    dense = dense_grads(model.param_specs(), grads, params)
    expected = np.zeros((16, 1), np.float32)
    expected[[2, 9], 0] = [1.5, -2.0]
    assert np.array_equal(dense["weights"], expected) and dense["bias"] is grads["bias"]


def test_state_copy_is_deep_and_arrays_are_ordered():
    model = LogisticRegression(hash_bits=3)
    state = TrainState.initial(model, make_optimizer("adam", 0.1), seed=0)
    assert [name for name, _ in state.arrays()] == ["bias", "weights", "bias/m", "bias/v",
                                                    "weights/m", "weights/v"]
    saved = state.copy()
    state.params["bias"] += 1
    state.optimizer_state["weights"]["m"] += 1
    state.step = 4
    assert saved.params["bias"][0] == 0 and saved.optimizer_state["weights"]["m"].sum() == 0 and saved.step == 0


def test_checksum_depends_on_values_not_layout():
    rng = np.random.default_rng(0)
    table = np.zeros((50, 2), np.float32)
    table[[3, 17, 40]] = rng.normal(size=(3, 2))
    bias = rng.normal(size=3).astype(np.float32)
    whole = checksum({"table": table, "bias": bias})
    assert whole == checksum({"bias": bias.copy(), "table": table.copy()})
    rows = SparseRows(np.array([3, 17, 40]), table[[3, 17, 40]])
    assert whole == checksum({"table": rows, "bias": bias})  # absent rows count as zeros
    nudged = table.copy()
    nudged[17, 1] = np.nextafter(nudged[17, 1], np.float32(np.inf))
    assert checksum({"table": nudged, "bias": bias}) != whole
    assert checksum({"table": table, "other": bias}) != whole  # names matter


def test_histograms_and_staleness_summary():
    assert histogram([0, 2, 2, 5]) == [1, 0, 2, 0, 0, 1]
    assert histogram([]) == []
    assert staleness_summary([0] * 6, [0] * 6) == {"read_max": 0, "read_hist": [6], "lag_hist": [6]}
    assert staleness_summary([1, 3], [0, 2])["read_max"] == 3


def test_the_written_result_leaves_the_parameters_out(tmp_path):
    path = tmp_path / "deep" / "result.json"
    result = TrainResult(config=TrainConfig(steps=2, batch=8), model="m", ranks=3, worker_count=2, dataset={},
                         steps=[{"step": 1}, {"step": 2}], traffic={}, staleness={}, wall_s=1.5, train_s=0.5,
                         final=FinalMetrics(0.5, 0.75, 1.25), params={"w": np.zeros(3)}, ps={})
    write_json(str(path), result.to_json())
    written = json.loads(path.read_text())
    assert "params" not in written and "recovery" not in written and written["ps"] == {}
    assert written["final"] == {"loss": 0.5, "accuracy": 0.75, "checksum": 1.25}
    assert (written["mode"], written["servers"], written["samples_per_s"]) == ("ring", 1, 32.0)
    assert written["config"]["steps"] == 2 and written["config"]["fault"]["kills"] == []


def test_config_problems_name_the_fields_and_the_cli_words_them_as_flags():
    assert TrainConfig().problems(4) == []
    problems = TrainConfig(optimizer="rmsprop", seed=-1, lr=0, topology=PS(fetch_every=2)).problems(4)
    fields = " | ".join(map(str, problems))
    assert "optimizer must be one of" in fields and "seed" in fields and "lr must be" in fields
    assert "fetch_every and push_every only apply to consistency asp" in fields
    flags = {"optimizer": "--optimizer", "seed": "--seed", "lr": "--lr", "fetch_every": "--fetch-every",
             "push_every": "--push-every", "consistency": "--consistency"}
    worded = " | ".join(p.render(flags) for p in problems)
    assert "--optimizer must be one of" in worded and "--seed" in worded and "--lr" in worded
    assert "--fetch-every and --push-every only apply to --consistency asp" in worded


def test_a_setting_of_another_mode_is_refused_by_its_flag_unless_it_changes_nothing():
    def said(*argv):
        return train_cmd.build_config(build_parser().parse_args(["train", *argv]))[1]
    assert said("--fetch-every", "2") == ["--fetch-every only applies to --mode ps and hybrid"]
    assert said("--mode", "ps", "--unit", "8") == ["--unit only applies to --mode sandblaster"]
    assert said("--servers", "2") == ["--servers only applies to --mode ps, hybrid and sandblaster"]
    assert said("--servers", "1", "--backups", "on") == []  # the defaults: nothing changes
    config = train_cmd.build_config(build_parser().parse_args(["train", "--mode", "sandblaster", "--servers", "2"]))[0]
    assert (config.mode, config.topology.servers, config.steps, config.optimizer) == ("sandblaster", 2, 30, "lbfgs")
    assert (config.batch, config.table_rows, config.topology.l2) == (1 << 17, 1 << 18, 5e-5)  # a batch method's
    mlp = train_cmd.build_config(build_parser().parse_args(["train", "--mode", "sandblaster", "--model", "mlp"]))
    assert mlp[1] == [] and mlp[0].problems(4) == []  # the model's usual --lr is not taken for one given
    assert (mlp[0].batch, mlp[0].steps, mlp[0].table_rows) == (1438, 100, None)
    given = train_cmd.build_config(build_parser().parse_args(["train", "--mode", "sandblaster", "--batch", "4096",
                                                              "--l2", "1e-3", "--data", "d"]))[0]
    assert (given.batch, given.topology.l2, given.table_rows, given.steps) == (4096, 1e-3, None, 30)


def fault(*kills, **fields):
    return FaultConfig(kills=[parse_kill(k) for k in kills], **fields)


@pytest.mark.parametrize("config, ranks, ps, ft", [  # the kills the fault-tolerance tests run, and more
    (fault("2@15", "1@15:recovery"), 4, False, True),
    (fault("4@10", "1@10:recovery"), 5, True, True),
    (fault("4@12", "1@10:recovery"), 5, True, True),  # PS: the first recovery at or after step 10
    (fault("0@20:checkpoint", checkpoint_dir="ckpt", checkpoint_every=10), 4, False, False),
    (fault("1@8", "4@20", replace=True), 4, False, True),  # id 4 is the replacement
    (fault("3@5:recovery", kill_random=0.1), 4, False, True),
    (FaultConfig(grow=[(1, 5), (1, 20)], kills=[parse_kill("2@25")]), 2, False, True),  # id 2 joined at 5
])
def test_kills_that_can_fire_are_accepted(config, ranks, ps, ft):
    assert config.problems(30, ranks, ft, ps) == []


@pytest.mark.parametrize("config, ps, ft, said", [
    (fault("4@5"), False, True, "no rank has id 4"),
    (fault("1@31"), False, True, "STEP must be from 1 to 30"),
    (fault("1@0"), False, True, "STEP must be from 1 to 30"),
    (fault("1@10:checkpoint"), False, True, "no checkpoint is written at step 10"),
    (fault("1@15:checkpoint", checkpoint_dir="ckpt", checkpoint_every=10), False, True, "no checkpoint"),
    (fault("1@10:recovery"), True, True, "no recovery can happen"),
    (fault("2@10", "1@12:recovery"), True, True, "no recovery can happen"),  # PS: none at or after 12
    (fault("1@10", "1@10:recovery"), False, True, "no recovery can happen"),  # its own death is no recovery
    (fault("2@10", "1@11:recovery"), False, True, "no recovery can happen"),  # ring: at that step only
    (fault("2@10", "1@10:recovery", checkpoint_dir="c"), False, False, "no recovery can happen"),  # no ULFM
    (FaultConfig(grow=[(1, 31)]), False, True, "grow 1@31: STEP must be from 1 to 30"),
])
def test_kills_and_growth_that_never_happen_are_refused(config, ps, ft, said):
    problems = " | ".join(map(str, config.problems(30, 4, ft, ps)))
    assert said in problems


BAD_FLAGS = {  # flag -> bad values, each refused naming the flag (by check_train_flags, without MPI)
    "--lr": ["0", "-1", "nan", "inf", "-inf"], "--steps": ["0", "-5"], "--batch": ["0"],
    "--kill": ["9@5", "1@0", "1@999", "x@y", "1@5:boom", "1@5:checkpoint", "1@5:recovery"],
    "--grow": ["1@999", "0@5", "a@b"], "--kill-random": ["1", "-0.1", "nan"], "--deadline": ["0", "nan", "inf"],
    "--restarts": ["-1"], "--optimizer": ["rmsprop"], "--mode": ["star"], "--progress": ["loud"],
    "--checkpoint-every": ["-1"], "--discover-every": ["0"], "-n": ["0"], "--seed": ["-1"],
}


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(BAD_FLAGS)), st.data(), min_size=1, max_size=4))
def test_fuzzed_bad_train_flags_are_each_refused_by_name(picked):
    chosen = {flag: data.draw(st.sampled_from(BAD_FLAGS[flag])) for flag, data in picked.items()}
    argv = ["train", "--ft", "--steps", "30"] + [f"{flag}={value}" if flag.startswith("--") else f"{flag}{value}"
                                           for flag, value in chosen.items()]
    args = build_parser().parse_args(argv)
    problems = train_cmd.launcher_problems(args)
    assert problems, chosen
    worded = [str(p) if isinstance(p, str) else p.render(args.flags) for p in problems]
    for flag, value in chosen.items():
        named = re.compile(re.escape(flag) + r"(?![\w-])")  # --kill, not --kill-random
        assert any(named.search(text) for text in worded), (flag, value, worded)
