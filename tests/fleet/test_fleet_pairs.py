"""The pair fleet (issue 35, items 3-4): its plan, its verdicts on simulated fleets, the family-wise false-call
rate measured by simulation, and its cost. Pure statistics: the measuring is a callable, the trial across
nodes plugs in later (no cluster here)."""

from __future__ import annotations

import math
import random

import pytest

from gpuvs.fleet.execute import pair_cost
from gpuvs.fleet.simulate import simulate_pairs as pair_simulate
from gpuvs.fleet.assess import pair_verdicts
from gpuvs.fleet.execute import pair_plan as pairs

ALPHA = 0.05


def nodes(n: int) -> list[str]:
    return pair_simulate.names(n)


@pytest.mark.parametrize("n,d", [(5, 3), (8, 3), (8, 4), (9, 3), (16, 4), (16, 5), (33, 6), (6, 5), (4, 4)])
def test_first_pass_gives_every_node_d_partners_no_self_pair_no_repeat(n, d):
    ps = pairs.first_pass(nodes(n), d, seed=3)
    assert all(a != b for a, b in ps)
    assert len(set(ps)) == len(ps)
    assert all(a < b for a, b in ps)
    for node in nodes(n):
        assert sum(node in p for p in ps) >= min(d, n - 1)
    if d >= n - 1:
        assert len(ps) == n * (n - 1) // 2
    elif n * d % 2 == 0:
        assert len(ps) == n * d // 2  # exactly d each


def test_first_pass_is_reproducible_by_seed_and_varies_with_it():
    assert pairs.first_pass(nodes(16), 4, seed=7) == pairs.first_pass(nodes(16), 4, seed=7)
    assert len({tuple(pairs.first_pass(nodes(16), 4, seed=s)) for s in range(6)}) > 1


@pytest.mark.parametrize("args,said", [((nodes(2), 2), "at least 3 nodes"), ((nodes(8), 2), "at least 3"),
                                       ((["a", "b", "a", "c"], 2), "named once")])
def test_a_plan_that_cannot_be_made_is_one_line(args, said):
    with pytest.raises(pairs.PlanError) as e:
        pairs.first_pass(*args)
    assert said in str(e.value) and "\n" not in str(e.value)


def test_second_pass_pairs_each_suspect_with_good_nodes_it_has_not_met():
    ns = nodes(16)
    first = pairs.first_pass(ns, 4, seed=1)
    suspects = {"node-7"} | {m for p in first if "node-7" in p for m in p}
    extra = pairs.second_pass(ns, first, suspects, 2, seed=1)
    assert len(extra) == 2 * len(suspects)
    for a, b in extra:
        assert (a in suspects) != (b in suspects)  # a suspect with a good node, never two of either
    assert not set(extra) & set(first)
    for s in suspects:
        assert sum(s in p for p in extra) == 2


def test_run_measures_the_first_pass_then_pairs_the_slow_node_with_good_nodes():
    rng = random.Random(5)
    asked = []

    def measure(p):
        asked.append(p)
        speed = 0.62 if "node-7" in p else 1.0
        return [100 * speed * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(4)]

    run = pairs.run_pairs(nodes(8), measure, pairs.PairPlan(partners=4, second=2, seed=2))
    assert asked == run.first + run.second
    assert "node-7" in run.suspects
    good = set(nodes(8)) - set(run.suspects)
    assert [p for p in run.second if "node-7" in p] and all(set(p) - {"node-7"} <= good
                                                             for p in run.second if "node-7" in p)
    out = run.outcome
    assert [v.node for v in out.nodes if v.verdict != "equivalent"] == ["node-7"]
    v = out.node("node-7")
    assert v.verdict == "slower" and v.ci_low < 0.62 < v.ci_high and v.ci_high < 0.7
    assert out.summary().startswith("node-7's links are 0.62x the fleet's [0.6")
    assert out.summary().endswith("; pairs without node-7 are equivalent")
    assert all(p.cause == "node-7" for p in out.pairs if "node-7" in p.pair)


@pytest.mark.parametrize("n", [8, 16])
def test_one_slow_node_among_8_and_16_is_named_and_no_other(n):
    rng = random.Random(n)
    ns = nodes(n)
    slow = ns[n - 3]

    def measure(p):
        return [100 * (0.62 if slow in p else 1.0) * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(4)]

    out = pairs.run_pairs(ns, measure, pairs.PairPlan(seed=n)).outcome
    assert [(v.node, v.verdict) for v in out.nodes if v.verdict != "equivalent"] == [(slow, "slower")]
    assert out.node(slow).ci_low < 0.62 < out.node(slow).ci_high
    assert out.summary().endswith(f"pairs without {slow} are equivalent")


@pytest.mark.parametrize("n", [4, 8, 16])
def test_one_slow_node_is_named_in_every_run_and_another_at_most_at_alpha(n):
    r = pair_simulate.simulate(n, 40, slow={n - 2: 0.62}, seed=11)
    assert r.found == r.runs
    assert r.false_node <= 1, r  # at most 1 in 40 (2.5%): the family-wise rate below holds it at alpha


@pytest.mark.parametrize("n", [8, 16])
def test_a_slow_link_is_named_as_a_pair_not_as_a_node(n):
    r = pair_simulate.simulate(n, 40, links=1, link_speed=0.6, seed=12)
    assert r.found == r.runs  # the pair called slower with cause "link"
    assert r.false_node == 0  # neither of its nodes (fine with their other partners) called slower


def test_a_slow_link_in_one_fleet_reads_as_a_link():
    rng = random.Random(3)
    ns = nodes(8)
    first = pairs.first_pass(ns, 4, seed=4)
    bad = first[5]

    def measure(p):
        return [100 * (0.6 if p == bad else 1.0) * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(4)]

    out = pairs.run_pairs(ns, measure, pairs.PairPlan(seed=4)).outcome
    assert out.of_pair(*bad).verdict == "slower" and out.of_pair(*bad).cause == "link"
    assert not [v for v in out.nodes if v.verdict in ("slower", "slower-within-margin")]
    assert f"the link {bad[0]}-{bad[1]} is 0.6" in out.summary()


def false_rate_bound(runs: int) -> float:
    """alpha plus two binomial standard errors at alpha: a rate at alpha stays below it 97.7% of the time."""
    return ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / runs)


@pytest.mark.parametrize("n,partners,cv", [(8, 4, 0.02), (16, 4, 0.02), (16, 3, 0.02), (16, 4, 0.01)])
def test_family_wise_false_call_rate_over_healthy_fleets_is_at_most_alpha(n, partners, cv):
    """3 partners, or noise so low that no second pass is made, are where a node's z's alone were too
    sure of themselves (13.9% and 6.3% false calls before the fleet's spread was counted)."""
    r = pair_simulate.simulate(n, 300, cv=cv, plan=pairs.PairPlan(partners=partners), seed=21 + n + partners)
    assert r.false_rate <= false_rate_bound(r.runs), r


def test_family_wise_false_call_rate_with_a_slow_node_is_at_most_alpha():
    r = pair_simulate.simulate(16, 200, slow={3: 0.62}, seed=31)
    assert r.found == r.runs
    assert r.false_rate <= false_rate_bound(r.runs), r


def test_without_the_correction_the_false_call_rate_is_far_above_alpha():
    """What the correction holds: each node and pair at alpha alone calls some healthy one in most runs."""
    r = pair_simulate.simulate(16, 100, correction=False, seed=41)
    assert r.false_rate > 0.3, r


def test_the_model_names_the_node_of_a_slow_pair_by_its_other_pairs():
    """A pair's figure less its partner's effect is the node's: with the pair means fixed (no noise but a
    tiny spread), node-3's pairs all read 0.5 and each partner's other pairs 1.0."""
    ns = nodes(6)
    vals = {}
    for p in pairs.first_pass(ns, 4, seed=0):
        level = 0.5 if "node-3" in p else 1.0
        vals[p] = [100 * level * 0.999, 100 * level * 1.001]
    out = pair_verdicts.judge(ns, vals, looks=1)
    assert out.node("node-3").speed == pytest.approx(0.5, rel=1e-3)
    assert all(out.node(n).speed == pytest.approx(1.0, rel=1e-3) for n in ns if n != "node-3")
    assert out.level == pytest.approx(100, rel=1e-3)


def test_cost_follows_the_plan():
    c = pair_cost.cost(8, 4, trials=4, second=2)
    assert c.first_pairs == 16 and c.second_pairs == 8  # node-1 and its 4 partners, each with 2 of the 3 good
    assert c.pair_trials == 4 * 24 and c.pod_starts == 2 * 4 * 24
    c = pair_cost.cost(4, 4)
    assert c.partners == 3 and c.first_pairs == 6 and c.second_pairs == 0  # every node a suspect: none good
    big = pair_cost.cost(1000, 4, trials=4, second=2, parallel=4)
    assert big.first_pairs == 2000 and big.second_pairs == 10
    assert big.pod_starts == 2 * 4 * 2010 and big.node_fleet_pod_starts == 4000
    assert big.rounds >= math.ceil(2000 / 4)
    assert big.wall_s == big.rounds * 4 * 10.0
    table = pair_cost.table()
    assert "| pod starts (2 per pair trial) | 48 | 192 | 336 | 16,080 |" in table


@pytest.mark.parametrize("n,d", [(6, 3), (8, 3), (8, 4), (10, 4), (12, 6), (16, 4), (20, 3)])
def test_every_plan_is_connected_with_an_odd_cycle(n, d):
    for seed in range(20):
        assert pairs.sound(nodes(n), pairs.first_pass(nodes(n), d, seed))
    ring = [pairs.pair(nodes(6)[i], nodes(6)[(i + 1) % 6]) for i in range(6)]
    assert not pairs.sound(nodes(6), ring)  # an even ring is bipartite


def test_failed_trials_and_a_pair_with_no_figure_are_left_out_not_a_crash():
    ns = nodes(6)
    vals = {p: [100.0, None, 101.0, 0.0, math.inf, 99.0] for p in pairs.first_pass(ns, 3, seed=0)}
    first = next(iter(vals))
    vals[first] = [None, 0.0]
    out = pair_verdicts.judge(ns, vals)
    assert first not in {v.pair for v in out.pairs}
    assert all(v.n == 3 for v in out.pairs)
    assert {v.node for v in out.nodes} == set(ns)


def test_a_run_stopped_in_measure_keeps_the_pairs_measured_so_far():
    kept: dict = {}
    calls = []

    def measure(p):
        calls.append(p)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return [100.0, 101.0, 99.0]

    with pytest.raises(KeyboardInterrupt):
        pairs.run_pairs(nodes(8), measure, values=kept)
    assert list(kept) == calls[:3] and all(v == [100.0, 101.0, 99.0] for v in kept.values())


def test_a_negative_second_pass_is_one_line():
    with pytest.raises(pairs.PlanError, match="second must be 0 or more"):
        pairs.run_pairs(nodes(8), lambda p: [1.0, 1.0], pairs.PairPlan(second=-1))
