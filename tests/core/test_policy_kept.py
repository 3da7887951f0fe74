"""A fresh drafter's cost-aware policy continues from the last one of its class on the same target."""

import specfamily as sf
from specfamily.core.policy import AutoPolicy
from specfamily.core.policy_kept import KeptPolicy, continue_policy
from specfamily.testing import OracleDrafter, RandomTreeDrafter, tiny_target


def idle_policy() -> AutoPolicy:
    """A policy that measured a dear draft (c 3: no length pays) and so drafts nothing but probes."""
    policy = AutoPolicy(4, verify_cost=1.0)
    for _ in range(6):
        gamma = policy.next_gamma()
        policy.update(gamma, 0, 3.0 if gamma else None, tokens=gamma)
    assert policy.c_estimate is not None and policy.next_gamma() == 0
    return policy


def test_resume_copies_the_estimates_and_schedule_not_the_pass_counts():
    previous = idle_policy()
    fresh = AutoPolicy(4)
    assert fresh.resume(previous)
    assert (fresh.c_estimate, fresh.interval, fresh.idle) == (previous.c_estimate, previous.interval, previous.idle)
    assert fresh.tried == previous.tried and fresh.tried is not previous.tried  # copied, not shared
    assert fresh.verify_cost == 1.0 and (fresh.passes, fresh.drafted) == (0, 0)
    assert fresh.next_gamma() == 0  # not its start gamma: it knows drafting does not pay
    fresh.tried[0] += 5
    assert fresh.tried[0] != previous.tried[0]


def test_resume_refuses_a_policy_that_ran_other_settings_or_itself():
    previous = idle_policy()
    ran = AutoPolicy(4)
    ran.next_gamma()
    assert not ran.resume(previous)
    other = AutoPolicy(4, max_gamma=8)
    assert not other.resume(previous) and other.c_estimate is None and other.next_gamma() == 4
    assert not previous.resume(previous)
    assert not AutoPolicy(4).resume(object())


def test_generate_continues_a_fresh_drafters_policy_on_the_same_target_only():
    target, other = tiny_target("llama", vocab_size=64), tiny_target("llama", vocab_size=64)
    first = RandomTreeDrafter(target, gamma=3, policy="auto")
    sf.generate(target, first, [1, 2, 3], max_new_tokens=12)
    assert first.policy.c_estimate is not None
    second = RandomTreeDrafter(target, gamma=3, policy="auto")
    sf.generate(target, second, [4, 5, 6], max_new_tokens=12)
    assert second.policy.tried[0] > first.policy.tried[0] * first.policy.memory  # counts carried, then added to
    assert target.batch_realized[("policy", "RandomTreeDrafter")].policy is second.policy
    elsewhere = RandomTreeDrafter(other, gamma=3, policy="auto")
    assert not continue_policy(other, elsewhere) and elsewhere.policy.c_estimate is None
    unlike = OracleDrafter(target, gamma=3, policy="auto")  # another class: its own record
    assert not continue_policy(target, unlike) and unlike.policy.c_estimate is None


def test_a_policy_without_resume_is_kept_and_left_alone():
    target = tiny_target("llama", vocab_size=64)
    constant = RandomTreeDrafter(target, gamma=3)
    assert not continue_policy(target, constant)
    assert not continue_policy(target, RandomTreeDrafter(target, gamma=3))
    assert isinstance(target.batch_realized[("policy", "RandomTreeDrafter")], KeptPolicy)
    target.batch_realized.clear()  # what a benchmark arm that learns from nothing does
    fresh = RandomTreeDrafter(target, gamma=3, policy="auto")
    assert not continue_policy(target, fresh) and fresh.policy.c_estimate is None
