"""Math verifier verdicts, the process pool's timeouts, and the reward scorer with custom functions."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest

from mentor_fast.config import RewardConfig
from mentor_fast.rewards import MathVerifierPool, RewardScorer, Status, is_correct, last_boxed, verify
from mentor_fast.types import Problem, Rollout

# 9^(9^(9^(9^9))): sympy starts evaluating the tower and never returns; measured in-process with
# math-verify's timeouts off: still running when killed after 30 s (with SIGALRM timeouts on, the
# alarm does interrupt it). The pool tests below use a 2 s timeout.
TOWER = r"The answer is \boxed{9^{9^{9^{9^{9}}}}}"
POOL_TIMEOUT_S = 2.0


# -- the verifier, in process ------------------------------------------------------------------


@pytest.mark.parametrize("completion, gold, expected", [
    (r"\boxed{0.5}", "1/2", True),
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"so $\boxed{\frac{2}{4}}$.", r"\frac{1}{2}", True),
    (r"\boxed{3}", "3.0", True),
    (r"\boxed{3.0}", "3", True),
    (r"\boxed{1,234}", "1234", True),  # thousands separator
    (r"\boxed{2^{10}}", "1024", True),  # a power is an answer form, not an unevaluated sum
    # math-verify reads a percentage as both p/100 and p: 50% equals 1/2 AND 50. We keep its rule.
    (r"\boxed{50\%}", r"\frac{1}{2}", True),
    (r"\boxed{50\%}", "50", True),
    (r"\boxed{12}", "15", False),
    (r"\boxed{-3}", "3", False),
    (r"\boxed{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", False),
])
def test_equivalent_and_wrong_forms(completion, gold, expected):
    v = verify(completion, gold)
    assert v.correct is expected, v
    assert v.status is Status.OK
    assert is_correct(completion, gold) is expected


def test_note_names_extracted_and_expected():
    v = verify(r"First 7, then \boxed{12}", "15")
    assert (v.correct, v.extracted, v.note) == (False, "12", "extracted 12, expected 15")


def test_no_boxed_answer_is_scored_from_text_and_noted():
    # Decision: no \boxed -> math-verify reads the text (answer anchors, then the last number);
    # the note says the box was missing so the mentor can diagnose a format failure.
    v = verify("12 + 7 = 19, so the answer is 19.", "19")
    assert v.correct and v.note.startswith("no \\boxed answer; ")
    w = verify("I am not sure how to do this.", "19")
    assert (w.correct, w.status) == (False, Status.NO_ANSWER)
    assert w.note == "no \\boxed answer; no answer found"
    # An echo of a ladder question is not an answer: the text's last number is 129, not 303.
    assert not verify("What is 47 + 385 - 129?", "303").correct


def test_unevaluated_expression_against_a_number_is_wrong():
    # math-verify alone says True here (it simplifies); on the arithmetic ladder that would pay a
    # policy for copying the question into the box.
    v = verify(r"\boxed{47 + 385 - 129}", "303")
    assert not v.correct and "not evaluated" in v.note
    assert verify(r"\boxed{303}", "303").correct


def test_malformed_latex_does_not_crash():
    v = verify(r"so the answer is \boxed{\frac{1}{", "1")
    assert not v.correct and v.status in (Status.UNPARSEABLE, Status.NO_ANSWER, Status.OK)
    # A truncated final box does not hide an earlier complete one.
    assert verify(r"\boxed{3}. Double-check: \boxed{\frac{1}{", "3").correct
    garbage = verify(r"\boxed{\left(}", "3")
    assert not garbage.correct and garbage.status is Status.UNPARSEABLE


def test_duplicated_and_repeated_boxes():
    assert verify(r"\boxed{840} \boxed{840}", "840").correct
    # The last box wins; math-verify alone would read "\boxed{1} ... \boxed{2}" as the set {1, 2}.
    assert verify(r"First \boxed{1}, corrected: \boxed{2}", "2").correct
    assert not verify(r"First \boxed{1}, corrected: \boxed{2}", "1").correct
    # A known hazard of math-verify: duplicated answers joined by a comma read as 840840.
    v = verify(r"\boxed{840,840}", "840")
    assert not v.correct and v.extracted == "840,840"


def test_last_boxed_brace_matching():
    assert last_boxed(r"x \boxed{\frac{1}{2}} y") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed(r"\boxed{1} and \fbox{2}") == "2"
    assert last_boxed(r"\boxed{3} then \boxed{\frac{1}{") == "3"
    assert last_boxed("no box") is None


def test_verify_refuses_signal_timeouts_off_the_main_thread():
    # The verl/TRL bug: signal.alarm raises in a thread and a broad except scores everything 0.
    # Here it is a loud error instead.
    errors: list[BaseException] = []

    def run():
        try:
            verify(r"\boxed{1}", "1")
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert len(errors) == 1 and "main thread" in str(errors[0])


# -- the pool -----------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """A pid with a /proc entry: running, or a zombie nobody reaped."""
    return os.path.exists(f"/proc/{pid}")


@pytest.mark.timeout(90)  # a pool that fails to kill the worker would hang here, not fail
def test_pool_kills_a_hung_worker_and_scores_the_rest():
    pool = MathVerifierPool(workers=2, timeout_s=POOL_TIMEOUT_S, signal_timeouts=False)  # only the kill
    with pool:
        pool.verify_batch([r"\boxed{1}"], ["1"])  # start and warm the workers outside the timing
        before = set(pool.pids)
        completions = [r"\boxed{12}", TOWER, r"\boxed{7}", r"\boxed{\frac{1}{2}}", "so 40"]
        golds = ["12", "12", "8", "0.5", "40"]
        t0 = time.monotonic()
        out = pool.verify_batch(completions, golds)
        elapsed = time.monotonic() - t0
        assert elapsed < POOL_TIMEOUT_S + 6.0, elapsed
        assert elapsed >= POOL_TIMEOUT_S  # it did wait for the hung item
        assert [v.correct for v in out] == [True, False, False, True, True]
        assert out[1].status is Status.TIMEOUT and out[1].error == "WallClockTimeout"
        assert all(v.status is Status.OK for i, v in enumerate(out) if i != 1)
        assert (pool.timeouts, pool.counters.restarts) == (1, 1)
        killed = before - set(pool.pids)
        assert len(killed) == 1 and not _alive(killed.pop())  # killed and reaped
        # The replacement worker scores correctly.
        again = pool.verify_batch([r"\boxed{5}"] * 3, ["5", "6", "5"])
        assert [v.correct for v in again] == [True, False, True]
        # A worker killed from outside while idle is replaced; its item is retried, not lost.
        os.kill(pool.pids[0], signal.SIGKILL)
        time.sleep(0.2)
        again = pool.verify_batch([r"\boxed{5}", r"\boxed{6}"], ["5", "5"])
        assert [(v.correct, v.status) for v in again] == [(True, Status.OK), (False, Status.OK)]
        assert pool.counters.restarts == 2
        pids = pool.pids
    assert pool.pids == [] and not any(_alive(p) for p in pids)  # closed: no zombies


@pytest.fixture(scope="module")
def scorer():
    """A scorer built through the registry; its pool (math-verify's own timeouts on) is shared."""
    with RewardScorer(RewardConfig(workers=2, timeout_s=POOL_TIMEOUT_S)) as s:
        yield s


@pytest.mark.timeout(90)
def test_signal_timeout_inside_worker_needs_no_restart(scorer):
    pool = scorer.verifier
    pool.verify_batch([r"\boxed{1}"], ["1"])  # started and warm
    restarts = pool.counters.restarts
    t0 = time.monotonic()
    out = pool.verify_batch([TOWER, r"\boxed{12}"], ["12", "12"])
    assert time.monotonic() - t0 < POOL_TIMEOUT_S + 6.0
    assert (out[0].status, out[0].error) == (Status.TIMEOUT, "TimeoutException")
    assert out[1].correct
    assert pool.counters.restarts == restarts


def test_pool_rejects_mismatched_lengths(scorer):
    with pytest.raises(ValueError, match="2 completions but 1 golds"):
        scorer.verifier.verify_batch(["a", "b"], ["1"])


# -- the scorer ---------------------------------------------------------------------------------


def _rollouts(texts: list[str], golds: list[str], columns: list[dict] | None = None) -> list[Rollout]:
    out = []
    for i, (text, gold) in enumerate(zip(texts, golds, strict=True)):
        p = Problem(f"p{i}", f"question {i}", gold, columns=(columns or [{}] * len(texts))[i])
        out.append(Rollout(p, i, [1], [2], [0.0], text, "stop", 0))
    return out


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """Custom reward functions in an importable module, as a user would write them."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent('''
        CALLS = []

        def raiser(completions, **kwargs):
            return [1 / 0 for _ in completions]

        def short(completions, **kwargs):
            return [1.0]

        def nan(completions, **kwargs):
            return [float("nan")] * len(completions)

        def sparse(completions, **kwargs):
            return [None if i % 2 == 0 else 0.25 * i for i in range(len(completions))]

        def contrarian(completions, gold, **kwargs):
            return [10.0 if "boxed{" + g + "}" not in c else -5.0 for c, g in zip(completions, gold)]

        def recorder(completions, **kwargs):
            CALLS.append(kwargs)
            return [0.0] * len(completions)
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import my_rewards

    return importlib.reload(my_rewards)


def _with(scorer: RewardScorer, functions: list[str], weights: list[float] = ()) -> RewardScorer:
    cfg = RewardConfig(functions=[f"my_rewards:{f}" for f in functions], weights=list(weights))
    return RewardScorer(cfg, verifier=scorer.verifier)


TEXTS = [r"\boxed{4}", r"\boxed{5}", "no idea", r"\boxed{7}"]
GOLDS = ["4", "4", "6", "7"]


def test_builtin_reward_metrics_and_notes(scorer):
    rollouts = _rollouts(TEXTS + [r"\boxed{\left(}"], GOLDS + ["1"])
    rollouts[1].finish_reason = "length"
    metrics = scorer.score(rollouts)
    assert [r.correct for r in rollouts] == [True, False, False, True, False]
    assert [r.reward for r in rollouts] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert rollouts[1].verifier_note == "truncated; extracted 5, expected 4"
    assert rollouts[2].verifier_note.startswith("no \\boxed answer")
    assert metrics["reward/math/mean"] == pytest.approx(2 / 5)
    assert metrics["reward/parse_error_rate"] == pytest.approx(1 / 5)  # the unparseable \left(
    assert metrics["reward/timeouts"] == 0.0


def test_raising_function_is_counted_and_scoring_goes_on(scorer, reward_module):
    s = _with(scorer, ["raiser", "sparse"])
    for _ in range(2):
        rollouts = _rollouts(TEXTS, GOLDS)
        metrics = s.score(rollouts)
        assert metrics["reward/errors/raiser/ZeroDivisionError"] == 1
        assert "reward/raiser/mean" not in metrics
        # raiser contributes nothing; sparse still counts: [None, 0.25, None, 0.75]
        assert [r.reward for r in rollouts] == [1.0, 0.25, 0.0, 1.75]
    assert s.errors["reward/errors/raiser/ZeroDivisionError"] == 2
    assert "division by zero" in s.last_error["raiser"]


@pytest.mark.parametrize("fn, error", [("short", "WrongLength"), ("nan", "BadValue")])
def test_unusable_return_values_are_errors(scorer, reward_module, fn, error):
    s = _with(scorer, [fn])
    rollouts = _rollouts(TEXTS, GOLDS)
    metrics = s.score(rollouts)
    assert metrics[f"reward/errors/{fn}/{error}"] == 1
    assert [r.reward for r in rollouts] == [1.0, 0.0, 0.0, 1.0]


def test_none_means_not_applicable(scorer, reward_module):
    s = _with(scorer, ["sparse"])
    rollouts = _rollouts(TEXTS, GOLDS)
    metrics = s.score(rollouts)
    assert [r.reward for r in rollouts] == [1.0, 0.25, 0.0, 1.75]
    assert metrics["reward/sparse/mean"] == pytest.approx(0.5)  # over the applicable items only
    assert metrics["reward/sparse/none_frac"] == pytest.approx(0.5)
    assert not any(k.startswith("reward/errors/") for k in metrics)


def test_weights_and_correct_flag_independent_of_shaped_reward(scorer, reward_module):
    s = _with(scorer, ["contrarian", "sparse"], weights=[2.0, 0.5, 4.0])
    rollouts = _rollouts(TEXTS, GOLDS)
    s.score(rollouts)
    # 2 * c + 0.5 * contrarian + 4 * sparse
    assert [r.reward for r in rollouts] == [2 - 2.5, 0 + 5 + 1.0, 0 + 5, 2 - 2.5 + 3.0]
    # The wrong answers got the highest rewards, yet `correct` is the verifier's flag alone.
    assert [r.correct for r in rollouts] == [True, False, False, True]


def test_function_keyword_arguments(scorer, reward_module):
    s = _with(scorer, ["recorder"])
    rollouts = _rollouts(TEXTS[:2], GOLDS[:2], columns=[{"difficulty": "easy"}, {"topic": "sums"}])
    s.score(rollouts)
    kw = reward_module.CALLS[-1]
    assert kw["prompts"] == ["question 0", "question 1"]
    assert kw["gold"] == kw["answer"] == ["4", "4"]
    assert kw["problem_id"] == ["p0", "p1"]
    assert kw["difficulty"] == ["easy", None] and kw["topic"] == [None, "sums"]


def test_bad_configuration_fails_at_construction(scorer, reward_module):
    with pytest.raises(ValueError, match="package.module:function"):
        RewardScorer(RewardConfig(functions=["my_rewards.sparse"]), verifier=scorer.verifier)
    with pytest.raises(ValueError, match="no callable 'missing'"):
        RewardScorer(RewardConfig(functions=["my_rewards:missing"]), verifier=scorer.verifier)
    with pytest.raises(ValueError, match="reward.weights has 1 entries; need 2"):
        RewardScorer(RewardConfig(functions=["my_rewards:sparse"], weights=[1.0]), verifier=scorer.verifier)
