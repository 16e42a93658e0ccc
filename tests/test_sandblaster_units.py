"""Sandblaster's bookkeeping without MPI: the unit schedule (load balancing, backups, first
result wins, a pass ends when every unit is pushed), the cubic step, the slices."""
import math

from hpcreduce.sandblaster import Roles, unit_size
from hpcreduce.sandblaster.lbfgs import _cubic_step
from hpcreduce.sandblaster.schedule import UnitPass


def test_units_in_order_then_backups_first_result_wins():
    units = UnitPass(3, backups=True, pace={1: 0.0, 2: 3600.0})  # worker 2 takes an hour a unit
    assert [units.next_unit(w) for w in (1, 2, 1)] == [0, 1, 2]
    assert units.report(1, 0) and units.next_unit(1) == 1  # a backup of the slow worker's unit
    assert units.backups_issued == 1
    assert units.next_unit(1) is None  # unit 2 is its own, unit 1 already backed up
    assert units.report(1, 1) and not units.report(2, 1)  # the backup wins, the original is dropped
    assert units.duplicates == 1 and units.holding(1) and not units.holding(2)
    assert units.report(1, 2)
    assert not units.done
    units.confirm(1)
    assert units.done and units.pushed == 3


def test_a_backup_only_when_it_would_finish_before_the_original():
    units = UnitPass(4, backups=True, pace={1: 1.0, 2: 1.0, 3: 1.0})
    assert [units.next_unit(w) for w in (1, 2, 3)] == [0, 1, 2]
    assert units.report(1, 0) and units.next_unit(1) == 3
    assert units.report(1, 3) and units.next_unit(1) is None  # copies of units at normal pace would not pay
    units.pace = {1: 1.0, 2: 1.0, 3: 100.0}  # worker 3 turns out slow: its unit is worth a backup
    assert units.next_unit(1) == 2 and units.backups_issued == 1
    assert UnitPass(2, backups=True).next_unit(1) == 0  # nothing measured yet: fresh units still flow
    overdue = UnitPass(2, backups=True, pace={1: 1.0, 2: 1.0})
    assert [overdue.next_unit(w) for w in (1, 2)] == [0, 1] and overdue.report(1, 0)
    overdue.handed[1] -= 10.0  # unit 1 has run ten times its expected second: a copy pays
    assert overdue.next_unit(1) == 1


def test_no_backups_when_off():
    units = UnitPass(2, backups=False)
    assert units.next_unit(1) == 0 and units.next_unit(2) == 1
    assert units.next_unit(3) is None and units.backups_issued == 0


def test_cubic_step_is_safeguarded():
    # f(t) = (t - 0.3)^2 from t = 0: the cubic through f(0), f'(0), f(1), f'(1) finds 0.3
    assert math.isclose(_cubic_step(1.0, 0.09, -0.6, 0.49, 1.4), 0.3)
    assert _cubic_step(1.0, 1e-4, -0.02, 0.9801, 1.98) == 0.1  # (t - 0.01)^2: clamped to [0.1 t, 0.5 t]
    assert _cubic_step(2.0, 0.0, -1.0, float("nan"), 0.0) == 1.0


def test_roles_slices_and_default_unit():
    roles = Roles(servers=2, size=5)
    assert roles.coordinator == 2 and roles.workers == [3, 4]
    assert roles.slices(7) == [(0, 0, 4), (1, 4, 7)]
    assert unit_size(4096, None, 2) == 256 and unit_size(10, None, 4) == 1 and unit_size(100, 7, 4) == 7
