"""Do the tests fail when a rule is removed? Each rule of the trust issues, taken out of a clean clone
one at a time, with the tests that guard it run against the result.

A mutation is one or more exact text edits (each `old` must occur exactly once, or the mutation is
stale and says so) that remove the rule while leaving the code importable. Outcomes:
  killed    the named tests fail on the mutant (the rule is guarded)
  survived  they pass (the rule is not guarded: a finding, and the script exits 1)
  error     pytest could not run them (collection error, timeout): not counted as guarded
Before any mutation the named tests must pass on the unmutated clone.

    python scripts/mutation_check.py                   # every mutation; receipt in bench/receipts/
    python scripts/mutation_check.py --only cache-key-includes-base,timed-tests-alone
    python scripts/mutation_check.py --list

It runs the committed HEAD (a clone), one process per mutation (pytest -n 0: the suite's timed-test
rule is one of the mutants), about 5-30 s each on the 2-core CI box.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    id: str
    issue: str
    rule: str
    edits: tuple[tuple[str, str, str], ...]  # (path, old text, new text)
    tests: tuple[str, ...]  # pytest node ids that must fail on the mutant


V = "tests/worker/verdicts/test_verdict.py::"
G = "tests/worker/guards/test_guards.py::"
R = "tests/worker/redteam/test_evaluations.py::"
E = "tests/worker/redteam/test_escape.py::"
R2 = "tests/worker/redteam/test_offclock.py::"
RACES = "tests/bot/test_races.py::"
RT = "tests/bot/test_rounds_redteam.py::"
H = "tests/bot/history/test_history_redteam.py::"

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("regressions-never-hide", "13.4", "a regression blocks a tier even beside a speedup (MIXED or REJECT)",
             (("worker/verdicts/rules.py", 'if slower and faster and s.regression_policy == "mixed":', "if False:"),
              ("worker/verdicts/rules.py", "    if slower:\n        extra", "    if slower and not faster:\n        extra")),
             (V + "test_a_regression_is_never_hidden_by_a_speedup",)),
    Mutation("tier-from-conservative-end", "13.4", "the tier comes from the interval's lower end, not the point",
             (("worker/verdicts/rules.py", "tier = Verdict(s.tier_for(best.ci_low))",
               "tier = Verdict(s.tier_for(best.rel_change))"),),
             (V + "test_tier_comes_from_the_conservative_end_of_the_interval",)),
    Mutation("uncalibrated-said-plainly", "13.1", "a gate without a bound gives UNCALIBRATED, never 'none, all pass'",
             (("worker/verdicts/rules.py", "    if uncalibrated:\n        return Decision(Verdict.UNCALIBRATED",
               "    if False:\n        return Decision(Verdict.UNCALIBRATED"),),
             (V + "test_uncalibrated_is_said_plainly_never_none_all_guards_pass",)),
    Mutation("interval-over-process-pairs", "13.4", "the interval's width is that of m process pairs, not of more",
             (("worker/gates/stats.py", "* sd / math.sqrt(m)", "* sd / math.sqrt(8 * m)"),),
             ("tests/worker/gates/test_stats.py::test_interval_is_over_process_pairs_and_honest_under_process_offsets",)),
    Mutation("zero-speed-refused", "seed", "a 0.0, NaN or negative speed is refused, never judged",
             (("worker/gates/stats.py",
               "if not (np.all(np.isfinite(b)) and np.all(np.isfinite(h)) and np.all(b > 0) and np.all(h > 0)):",
               "if False:"),),
             ("tests/worker/gates/test_stats.py::test_zero_nan_or_negative_speed_is_refused",)),
    Mutation("kl-paired-against-base", "13.5", "head KL several times base's on the same prompts fails the guard",
             (("worker/guards/scoring.py", "        if head.kl > paired_kl:", "        if False:"),),
             (G + "test_kl_multiplied_with_top1_unchanged_is_rejected",)),
    Mutation("baseline-failing-is-infra", "13.5", "main failing its own bars is INFRA, never the PR's REJECT",
             (("worker/guards/scoring.py", "    check_baseline(model, base, b)\n", ""),),
             (G + "test_main_failing_its_own_bars_is_infra_not_reject",)),
    Mutation("bit-identical-cannot-fail", "13.5", "a head bit-identical to base cannot fail its guard",
             (("worker/guards/scoring.py", "    if not bit:  # bit-identical", "    if True:  # bit-identical"),),
             (G + "test_bit_identical_head_cannot_fail",)),
    Mutation("timed-outputs-verified", "13.6", "the timed requests' logits are judged against the reference",
             (("worker/gates/verify.py", "    if head.kl_mean > bound or head.kl_max > worst_bound:", "    if False:"),),
             ("tests/worker/gates/test_decode_steps.py::test_step_kl_and_misses_are_judged_against_base",
              R + "test_doing_less_work_when_not_asked_for_all_logits_is_caught")),
    Mutation("every-timed-prefill-checked", "13.6", "a timed prefill's logits are checked on every rep, not only "
             "on the reps drawn for the decode check",
             (("worker/gates/verify.py", 'reps=verified if g.metric == "decode_tok_s" or not every_rep else None)',
               "reps=verified)"),),
             (R + "test_cheating_on_the_reps_that_are_not_verified_is_caught_in_every_timed_prefill",)),
    Mutation("infra-attempt-blocks-tier", "13.7", "an earlier INFRA attempt blocks a tier until a clean evaluation",
             (("worker/verdicts/attribution.py", "    if attempt > 1 or history:", "    if False:"),),
             (V + "test_an_earlier_infra_attempt_blocks_a_tier",)),
    Mutation("cache-key-includes-base", "13.7", "the result cache key includes base's SHA",
             (("worker/queue/tasks.py", ',\n             job.get("base_sha") or job.get("base_ref")]', "]"),),
             ("tests/worker/verdicts/test_trust.py::test_result_cache_key_includes_base_and_head",)),
    Mutation("runtime-change-checks-the-floor", "13.1", "after main's runtime changed, its floor waits for fresh A/A "
             "pairs of it and is rebuilt when their noise differs, quieter included",
             (("worker/calibration/runtime_change.py", "    if p < alpha:", "    if False:"),),
             ("tests/worker/calibration/test_runtime_change.py::test_a_quieter_runtime_rebuilds_the_floor",
              "tests/worker/calibration/test_runtime_change.py::test_a_noisier_runtime_rebuilds_the_floor")),
    Mutation("runtime-change-quieter-counts", "13.3", "a quieter runtime is a change too (its floor regains sensitivity)",
             (("worker/calibration/runtime_change.py", "[abs(x) for x in before], alternative=\"two-sided\")",
               "[abs(x) for x in before], alternative=\"greater\")"),),
             ("tests/worker/calibration/test_runtime_change.py::test_a_quieter_runtime_rebuilds_the_floor",)),
    Mutation("runtime-change-pairs-recorded-first", "13.1", "a worker records the changed runtime's A/A pairs "
             "before it evaluates",
             (("worker/calibration/auto.py", "    return all(len(lines[k].rows) >= n and not lines[k].wanted",
               "    return all(len(lines[k].rows) >= n"),),
             ("tests/worker/calibration/test_runtime_change.py::"
              "test_the_worker_records_the_new_runtimes_pairs_before_evaluating",)),
    Mutation("drift-rebuilds-the-floor", "13.2", "A/A noise that changed retires the old floor and says so",
             (("worker/calibration/history.py", "            if p < s.drift_alpha:", "            if False:"),),
             ("tests/worker/calibration/test_history.py::test_drift_rebuilds_the_floor_and_says_so",)),
    Mutation("stale-history-expires", "13.2", "A/A pairs older than aa_max_age_days do not back a floor",
             (("worker/calibration/history.py", "    since = now - s.aa_max_age_days * 86400", "    since = 0.0"),),
             ("tests/worker/calibration/test_history.py::test_stale_history_expires",)),
    Mutation("comment-fence-outlasts-pr-text", "14.6", "a log tail's fence is longer than any backtick run in it",
             (("worker/safe_text.py", 'fence = "`" * max(3, longest + 1)', 'fence = "```"'),),
             (R + "test_comment_injection_is_escaped",)),
    Mutation("no-html-comment-from-pr-text", "14.6", "PR text can never open an HTML comment in the sticky comment",
             (("worker/safe_text.py", '.replace("<!--", "<!-\\u200b-")', ""),),
             (R + "test_comment_injection_is_escaped",)),
    Mutation("pipeline-fails-closed", "14.4", "without the full sandbox an evaluation is INFRA sandbox_unavailable",
             (("worker/pipeline.py", "            if not iso.full and not self.settings.sandbox_dev_override:",
               "            if False:"),
              ("worker/sandbox/process.py", "    if not iso.full and not allow_degraded:", "    if False:")),
             (R + "test_without_the_full_sandbox_the_evaluation_is_infra",)),
    Mutation("spawn-fails-closed", "14.4", "the sandbox itself refuses to start a revision under a weaker sandbox",
             (("worker/sandbox/process.py", "    if not iso.full and not allow_degraded:", "    if False:"),),
             ("tests/worker/sandbox/test_sandbox.py::test_spawn_refuses_a_weaker_sandbox",)),
    Mutation("idle-revision-frozen", "14.3", "the revision not being timed is frozen, so hogging it gains nothing",
             (("worker/gates/bench.py", "            if freeze:\n                other.freeze(True)",
               "            if False:\n                other.freeze(True)"),),
             ("tests/worker/gates/test_freeze.py::test_the_other_revision_is_frozen_for_every_timed_request",)),
    Mutation("idle-cpu-is-the-revisions-fault", "14.3", "CPU spent while the other is timed (deferred work) is a fault",
             (("worker/gates/bench.py", "        if idle_cpu[r] > 0.2 * window[other]", "        if False and idle_cpu[r] > 0.2 * window[other]"),),
             ("tests/worker/gates/test_freeze.py::test_cpu_spent_while_the_other_is_timed_is_the_revisions_fault",)),
    Mutation("capabilities-dropped", "14.1", "revision code runs with no capabilities (CapEff and CapBnd 0)",
             (("worker/sandbox/bwrap.py", '"--gid", str(SANDBOX_UID), "--cap-drop", "ALL",', '"--gid", str(SANDBOX_UID),'),),
             (E + "test_least_privilege_inside",)),
    Mutation("seccomp-refuses-mount", "14.1", "the seccomp filter refuses mount even for root in the namespace",
             (("worker/sandbox/seccomp.py", '    "mount", "umount2", "pivot_root",', '    "umount2", "pivot_root",'),),
             (E + "test_seccomp_refuses_escapes_even_for_root",)),
    Mutation("memory-max-set", "14.3", "each revision's cgroup has memory.max, which counts its tmpfs",
             (("worker/sandbox/cgroups.py", '                    _write(self.mem_dir / "memory.max", str(memory_max))',
               "                    None"),  # cgroup v2 (the GPU box); v1's memory controller below (this CPU box)
              ("worker/sandbox/cgroups.py", '                    _write(self.mem_dir / "memory.limit_in_bytes", str(memory_max))',
               "                    None"),
              ("worker/sandbox/cgroups.py", "                        _write(sw, str(memory_max))", "                        None")),
             (E + "test_tmpfs_counts_against_the_memory_limit",)),
    Mutation("pids-max-set", "14.3", "each revision's cgroup has pids.max: a fork bomb stops there",
             (("worker/sandbox/cgroups.py", '                _write(self.pids_dir / "pids.max", str(pids_max))',
               "                None"),),
             (E + "test_fork_bomb_stops_at_pids_max_and_leaves_nothing",)),
    Mutation("scratch-size-capped", "14.3", "the revision's scratch is a size-capped tmpfs, never host disk",
             (("worker/sandbox/bwrap.py", '"--perms", "0755", "--size", str(spec.scratch_bytes), "--tmpfs", SCRATCH]',
               '"--perms", "0755", "--tmpfs", SCRATCH]'),),
             (E + "test_scratch_is_size_capped",)),
    Mutation("environment-scrubbed", "14.2", "the revision sees an allow-listed environment, no service secrets",
             (("worker/sandbox/process.py", "    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}",
               "    env = dict(os.environ)"),),
             ("tests/worker/sandbox/test_sandbox.py::test_environment_is_scrubbed",)),
    Mutation("answer-size-capped", "14.5", "an answer's announced size is checked before any of its body is read",
             (("worker/harness/frames.py", "        if n > self.max_bytes:", "        if False:"),),
             ("tests/worker/harness/test_frames.py::test_an_oversized_announcement_is_refused_before_its_body",)),
    Mutation("head-fault-confirmed-once", "13.7", "a head fault is rerun once before it becomes the PR's REJECT",
             (("worker/verdicts/attribution.py", "    second = rerun()\n", "    second = first\n"),),
             (V + "test_head_fault_is_confirmed_by_one_retry_then_rejected",)),
    Mutation("oom-judged-by-base-memory", "13.7", "a head OOM is the PR's only when base's measured peak fitted",
             (("worker/verdicts/faults.py", "    if base > OOM_HEADROOM * limit:", "    if False:"),),
             (V + "test_head_oom_is_judged_by_base_measured_memory_not_the_message",)),
    Mutation("base-failure-is-infra", "13.7", "a failure of the baseline is INFRA, never the PR's verdict",
             (("worker/verdicts/faults.py", '    if f.role == "base":\n', '    if False:\n'),),
             (V + "test_a_baseline_fault_of_any_kind_is_infra_never_the_prs",)),
    Mutation("webhook-signature-checked", "bot", "a webhook without a valid X-Hub-Signature-256 is refused",
             (("bot/web/webhook.py", '        if not verify(settings.webhook_secret, raw, headers.get("x-hub-signature-256")):',
               "        if False:"),),
             ("tests/bot/web/test_webhook.py::test_bad_signature_is_401_and_stores_nothing",)),
    Mutation("commands-need-write-access", "bot", "only a user with write access can run /eval",
             (("bot/service.py", "        return self.github.is_trusted(repo.installation_id, repo.full_name, login)",
               "        return True"),),
             ("tests/bot/test_triggers.py::test_command_from_user_without_permission_is_refused",)),
    Mutation("override-never-merged", "14.4", "a verdict made under the sandbox override never enters a round",
             (("bot/rounds.py", '        if ev is not None and (ev.result or {}).get("sandbox_override"):\n            continue\n',
               ""),),
             ("tests/bot/test_rounds.py::test_only_a_tier_made_in_the_full_sandbox_is_a_candidate",)),
    Mutation("cpu-quick-never-merges", "19.1", "in production a CPU quick verdict never counts in a round",
             (("bot/rounds.py", "(not production or ev.profile in MERGEABLE_PROFILES):", "True:"),),
             ("tests/bot/test_rounds.py::test_production_round_counts_only_gpu_profiles",)),
    Mutation("pr-locked-before-its-evaluation", "bot", "claims lock the PR before its evaluation (handlers' order)",
             (("bot/service.py", "        pr = self.lock_pull(session, pr_id) if pr_id is not None else None\n",
               "        pr = pr_id is not None\n"),
              ("bot/service.py", '            return f"evaluation {eval_id} unknown"\n',
               '            return f"evaluation {eval_id} unknown"\n        pr = self.lock_pull(session, ev.pull_request_id)\n')),
             ("tests/bot/queue/test_lock_order.py::"
              "test_a_start_claim_during_a_cancel_waits_for_the_pull_request_without_holding_the_evaluation",)),
    Mutation("sticky-is-our-own", "14.6", "only the App's own comment is adopted as the sticky one, never a stranger's",
             (("bot/github/publish.py",
               'if (comment.body or "").startswith(STICKY_MARKER) and comment.user.login == bot_login:',
               'if (comment.body or "").startswith(STICKY_MARKER):'),),
             ("tests/bot/github/test_publish.py::test_a_strangers_comment_with_the_sticky_marker_is_never_adopted",)),
    Mutation("refused-merge-skipped", "bot", "a winner GitHub refuses to merge is skipped; the next best merges",
             (("bot/rounds.py", "except publish.MergeRefused as exc:", "except ZeroDivisionError as exc:"),),
             ("tests/bot/test_rounds.py::test_a_winner_github_refuses_to_merge_does_not_stall_every_round",)),
    Mutation("speedup-against-its-own-base", "bot", "only a tier measured against the branch it merges into wins",
             (("bot/rounds.py", " and ev.base_ref == repo.default_branch and (not production", " and (not production"),
              ("bot/rounds.py", "if live.base.ref != ev.base_ref:", "if False:")),
             ("tests/bot/test_rounds.py::test_only_a_speedup_measured_against_the_branch_it_merges_into_wins",)),
    Mutation("closed-pr-never-evaluated", "bot", "a closed pull request is never evaluated again",
             (("bot/service.py", "        if not pr.is_open:\n            return None\n", ""),
              ("bot/handlers.py", "        if not pr.is_open:\n            publish.reply(", "        if False:\n            publish.reply("),
              ("bot/handlers.py", "        if not pr.is_open:\n            return f\"{action}: pull",
               "        if False:\n            return f\"{action}: pull")),
             ("tests/bot/test_triggers.py::test_a_closed_pull_request_is_never_evaluated_again",)),
    Mutation("retried-tier-not-a-candidate", "13.7", "a tier from a retry after an INFRA attempt is never merged",
             (("bot/rounds.py", "if ev is not None and ev.attempt > 1:", "if False:"),),
             ("tests/bot/test_rounds.py::test_a_tier_measured_after_an_infra_attempt_is_not_a_candidate",)),
    Mutation("infra-rerun-blocks-older-tier", "13.7", "a later INFRA evaluation of the same head blocks its older tier",
             (("bot/rounds.py", "if ev is not None and infra_since(session, pr, ev):", "if False:"),),
             (RT + "test_a_verdict_followed_by_an_infra_rerun_of_the_same_head_is_not_merged",)),
    Mutation("closed-on-github-told-nothing", "bot", "a PR GitHub shows closed is neither told main moved nor re-evaluated",
             (("bot/rounds.py", "if pr.id not in closed and (winner", "if (winner"),
              ("bot/rounds.py", "            if not still_open_live(gh, other):", "            if False:")),
             (RT + "test_a_pr_closed_on_github_is_neither_told_main_moved_nor_re_evaluated",)),
    Mutation("loser-read-live", "bot", "a loser is read live before it is told main moved",
             (("bot/rounds.py", "            if not still_open_live(gh, other):", "            if False:"),),
             (RT + "test_a_loser_closed_on_github_whose_close_was_never_delivered_is_neither_told_nor_re_evaluated",)),
    Mutation("lost-merge-answer-still-winner", "bot", "a merge at the measured head onto the measured base is the "
             "winner though no answer of it arrived",
             (("bot/rounds.py", "            if not (live.merged and live.head.sha == ev.head_sha and not won_before"
               "(session, pr)\n                    and landed(gh, ev, live.merge_commit_sha, method)):",
               "            if True:"),),
             (RT + "test_a_merge_whose_every_answer_was_lost_is_still_the_rounds_winner[down]",)),
    Mutation("merge-landed-where-measured", "bot", "a merge that landed elsewhere (retargeted mid-merge) is not a "
             "winner", (("bot/rounds.py", "            if not landed(gh, ev, merged_sha, method):", "            if False:"),),
             (RT + "test_a_retarget_between_the_rounds_checks_and_its_merge_is_not_a_main_winner",)),
    Mutation("merged-row-not-reopened", "bot", "an older payload replayed after the merge cannot reopen the winner",
             (("bot/rounds.py", "        try:\n            mark_closed(pr, gh.get_pull(pr.number))\n        except Exception:  # noqa: "
               "BLE001 - GitHub away", "        try:\n            pr.is_open = False\n        except Exception:  # noqa: "
               "BLE001 - GitHub away"),),
             (RT + "test_an_older_payload_replayed_after_the_round_merged_cannot_reopen_the_winner",)),
    Mutation("merge-counted-once", "bot", "a merge is a round's winner once, even when its row was reopened",
             (("bot/rounds.py", "live.head.sha == ev.head_sha and not won_before(session, pr)",
               "live.head.sha == ev.head_sha"),),
             (RT + "test_a_merge_is_counted_once_even_when_a_payload_reopens_its_row",)),
    Mutation("head-measured-as-it-would-land", "13.7", "a head that lacks its base is measured merged with it",
             (("worker/checkout.py", "        merged = merged_commit(git_dir, hsha, bsha)\n", "        merged = None\n"),),
             ("tests/worker/test_checkout.py::test_a_speedup_that_is_only_the_lack_of_mains_later_regression_is_not_measured",
              "tests/worker/test_checkout.py::test_a_head_that_does_not_merge_with_its_base_is_the_prs_failure_not_infra")),
    Mutation("stray-check-runs-withdrawn", "bot", "a check run no evaluation refers to, left queued when GitHub "
             "refused its withdrawal, is completed by the next dispatch",
             (("bot/service.py", "        self._withdraw_strays(session, repo, pr, ev)\n", ""),),
             ("tests/bot/test_faults.py::test_a_check_run_github_will_not_withdraw_is_completed_by_the_retrys_dispatch",)),
    Mutation("merged-close-never-stale", "bot", "GitHub's `closed` webhook of a merge is handled even when older "
             "than the stored row (main's history measures it)",
             (("bot/handlers.py", "if pr.id in session.info.get(\"stale_pulls\", ()) and not merged:",
               "if pr.id in session.info.get(\"stale_pulls\", ()):"),),
             (RT + "test_the_closed_webhook_of_the_rounds_own_merge_measures_main[older than the stored row's]",)),
    Mutation("bisection-step-retried", "bot", "a bisection step that failed after its measurement landed is taken "
             "on the task's retry", (("bot/history/tasks.py", "    return why if taken else m", "    return why"),),
             (H + "test_a_bisection_step_that_failed_after_its_measurement_landed_is_taken_on_retry",)),
    Mutation("only-a-conflict-is-the-prs", "13.7", "a merge that fails for the host's reasons is INFRA, not the PR's",
             (("worker/checkout.py", "            raise CheckoutError(f\"git merge-tree failed:",
               "            raise MergeConflict(f\"git merge-tree failed:"),),
             ("tests/worker/test_checkout.py::test_a_merge_the_host_cannot_make_is_infra_not_the_prs",)),
    Mutation("no-rebase-merge-of-a-merged-measurement", "bot", "a head measured merged with its base is not "
             "rebase-merged", (("bot/rounds.py", 'if method == "rebase" and gh.compare(ev.base_sha, ev.head_sha).behind_by:',
                                 "if False:"),),
             (RT + "test_a_head_measured_merged_with_its_base_is_not_rebase_merged",)),
    Mutation("dashboard-per-machine", "bot", "the dashboard plots one series per device model, as the detector scans",
             (("bot/web/views.py", "        groups = by_machine(session, series(session, repo.id, m, g))",
               "        groups = {\"all\": series(session, repo.id, m, g)}"),),
             ("tests/bot/web/test_pages.py::test_history_plots_one_series_per_device_model",)),
    Mutation("culprit-needs-evidence", "bot", "a commit is named culprit only on a paired measurement that shows the "
             "step", (("bot/history/job.py", "culprit, rel = between[0], evidence(session, cp, between[0], cp.good_sha)",
                       "culprit, rel = between[0], cp.rel_step"),),
             (H + "test_a_false_alarm_is_not_named_as_a_culprit_without_evidence",
              H + "test_bisection_whose_every_midpoint_is_good_names_no_culprit")),
    Mutation("history-in-main-order", "bot", "main's history is in first-parent order, not webhook order",
             (("bot/history/job.py", "        line = commits.first_parent_line(repo.clone_url, repo.default_branch) "
               "if repo.clone_url else None", "        line = None"),),
             (H + "test_out_of_order_webhooks_blame_the_right_commit_and_pr",)),
    Mutation("dashboard-in-main-order", "bot", "the dashboard plots main's history in the order the detector scans "
             "(first-parent positions the scan stored), not queue order",
             (("bot/history/job.py", "MAIN_ORDER = (MainMeasurement.main_position.is_(None), MainMeasurement.main_position, ",
               "MAIN_ORDER = ("),),
             (H + "test_the_dashboard_plots_main_in_the_order_the_detector_scans",)),
    Mutation("stale-change-point-post-refreshed", "bot", "a change-point post whose edit GitHub refused is edited "
             "again by the beat", (("bot/history/job.py", "        cp.post_stale = True\n", ""),),
             (H + "test_a_bisection_that_ended_while_github_was_down_is_posted_by_the_beat",)),
    Mutation("handler-claim-renewed", "bot", "a live handler slower than its lease keeps its claim (no second "
             "handler beside it)", (("bot/queue/lease.py", "        while not self._stop.wait(self.lease_s / 3):",
                                     "        while False:"),),
             ("tests/bot/test_faults.py::test_a_live_handler_slower_than_its_lease_keeps_its_claim",)),
    Mutation("renewal-checks-the-claim-as-it-writes", "bot", "a renewal in flight does not push back the retry "
             "`_failed` scheduled (SQLite locks no row)",
             (("bot/queue/lease.py", "update(Delivery).where(*carries)", "update(Delivery).where(carries[0])"),),
             ("tests/bot/queue/test_lease.py::test_a_renewal_in_flight_does_not_push_back_the_retry_failed_scheduled",)),
    Mutation("force-pushed-merges-off-the-history", "bot", "merges force-pushed off main leave the plotted history "
             "as the detector scans it", (("bot/history/job.py", "        m.main_position = line.get(m.sha, OFF_MAIN)",
                                           "        m.main_position = line.get(m.sha)"),),
             (H + "test_a_force_pushed_main_is_plotted_as_the_detector_scans_it",)),
    Mutation("stale-post-beat-skips-a-stepped-change-point", "bot", "the stale-post beat is not held up by a "
             "bisection step in progress", (("bot/history/job.py", 'with_for_update={"skip_locked": True}, '
                                            "populate_existing=True)", "with_for_update=True, populate_existing=True)"),),
             (H + "test_the_stale_post_beat_is_not_held_up_by_a_bisection_step_in_progress",)),
    Mutation("hung-handler-let-go", "bot", "a handler running past handler_max_s lets its claim lapse (a hung one "
             "does not hold its delivery for ever)", (("bot/queue/lease.py", "            if time.monotonic() > until:",
                                                       "            if False:"),),
             ("tests/bot/queue/test_lease.py::test_a_live_handler_is_renewed_and_a_hung_one_let_go",)),
    Mutation("demo-on-a-host-without-the-sandbox", "CI", "the quick start's demo shows its REJECT on a machine "
             "without bubblewrap (its own branch, said plainly), and never overrides where the sandbox works",
             (("worker/cli.py", "    if iso.full:\n        return settings\n", "    return settings\n"),),
             ("tests/worker/test_demo.py::test_the_demo_runs_its_own_branch_on_a_host_without_the_full_sandbox_and_says_so",)),
    Mutation("history-per-machine", "bot", "absolute tok/s of different GPU models are not one series",
             (("bot/history/job.py", "machine = {m.id: machine_of(m) for m", "machine = {m.id: \"one\" for m"),),
             (H + "test_a_gpu_pool_change_is_not_a_regression_on_main",)),
    Mutation("history-point-stored-before-post", "bot", "a main measurement is stored before its scan posts",
             (("bot/history/tasks.py", "            # Stored before the scan: a post GitHub refuses (or any failure "
               "after this) must not take the point\n            # out of main's history with it. Then the locks "
               "again, in the same order.\n            session.commit()\n", ""),),
             (H + "test_github_down_while_posting_does_not_lose_the_measurement",)),
    Mutation("merge-never-skipped-when-mirror-away", "bot", "a merge whose parent cannot be read is stored, not skipped",
             (("bot/history/measure.py", "        parent = \"\"\n", "        return None\n"),),
             (H + "test_github_unreachable_at_merge_does_not_silently_skip_the_commit",)),
    Mutation("unsent-measurement-sent-on-redelivery", "bot", "a redelivered merge sends its never-sent measurement",
             (("bot/history/measure.py", "        if existing.state == UNSENT:", "        if False:"),),
             (H + "test_broker_down_at_merge_then_redelivered_measures_the_merge",)),
    Mutation("unsent-measurement-sent-by-beat", "bot", "the beat sends a measurement the broker refused",
             (("bot/history/measure.py", ".where(MainMeasurement.state == UNSENT)\n",
               ".where(MainMeasurement.state == \"never\")\n"),),
             (H + "test_a_measurement_the_broker_refused_is_sent_by_the_beat",)),
    Mutation("commands-outside-code", "bot", "a /eval shown in a code block (fenced or indented) is not a command",
             (("bot/handlers.py", 'COMMAND_RE.search(FENCED_RE.sub("", body) if', "COMMAND_RE.search(body if"),
              ("bot/handlers.py", 'r"^ {0,3}/eval(', 'r"^[ \\t]*/eval(')),
             ("tests/bot/test_triggers.py::test_a_command_shown_in_code_is_not_a_command",)),
    Mutation("commands-only-in-new-human-comments", "bot", "an edited comment or a bot's comment runs no command",
             (("bot/handlers.py", 'if payload.get("action") != "created":',
               'if payload.get("action") not in ("created", "edited"):'),
              ("bot/handlers.py", 'if (comment.get("user") or {}).get("type") == "Bot":', "if False:")),
             ("tests/bot/test_triggers.py::test_an_edited_comment_or_a_bots_comment_runs_no_command",)),
    Mutation("answer-kinds-allow-listed", "13.7", "a revision cannot label its own crash INFRA (only the driver's kinds)",
             (("worker/harness/client.py", "if kind not in ANSWER_KINDS:", "if False:"),),
             (R2 + "test_a_head_that_labels_its_crash_a_sandbox_fault_is_not_infra",)),
    Mutation("forged-answer-fields-are-the-prs", "13.7", "fields a revision forges in its answers are not INFRA",
             (("worker/harness/client.py",
               "        self.hello = {k: resp[k] if type(resp.get(k)) is int else short_text(resp.get(k)) for k in HELLO_FIELDS}",
               "        self.hello = resp"),
              ("worker/harness/client.py", "            if type(vocab) is not int or vocab <= 0:", "            if False:")),
             (R2 + "test_forged_fields_in_the_drivers_answers_are_the_prs_fault",)),
    Mutation("reported-memory-bounded", "13.7", "a revision's memory report is neither INFRA nor kept unbounded",
             (("worker/harness/client.py", "    if not isinstance(report, dict) or len(report) > MEMORY_ENTRIES:\n        return None\n",
               ""),
              ("worker/pipeline.py", '.get("memory"))', '["memory"])')),
             (R2 + "test_a_forged_memory_report_is_neither_infra_nor_kept_whole",
              "tests/worker/harness/test_answers.py::test_a_memory_report_of_another_shape_is_not_kept")),
    Mutation("nonfinite-timed-prefill-is-the-prs", "13.7", "NaN logits in a timed prefill are the producing side's fault",
             (("worker/gates/bench.py", 'raise RevisionFault(role, phase, "nonfinite", f"{what} returned non-finite logits")',
               'raise infra(InfraKind.NAN_METRIC, f"{role}: {what} returned non-finite logits")'),),
             (R2 + "test_nan_only_in_timed_prefills_is_the_prs_fault",)),
    Mutation("branch-names-in-code-spans", "14.6", "a backtick in a branch name cannot close its code span",
             (("templates/merge_first_winner.md.j2", "{{ base_ref | code }}", "`{{ base_ref }}`"),),
             ("tests/bot/render/test_render.py::test_a_backtick_in_a_branch_name_cannot_close_its_code_span",)),
    Mutation("retarget-reevaluates", "bot", "a PR whose base changed is evaluated again against its new base",
             (("bot/handlers.py", "            if not base_from or base_from == pr.base_ref:", "            if True:"),),
             ("tests/bot/test_triggers.py::test_a_retargeted_pull_request_is_evaluated_against_its_new_base",)),
    Mutation("timed-prompts-staged-masked", "14.3", "staged prompts are masked until their timed request",
             (("worker/gates/bench.py", "masked, seeds[(r, k)] = masking.mask(sweep.prompts[k], vocab)",
               "masked, seeds[(r, k)] = sweep.prompts[k], None"),),
             (R2 + "test_precomputing_staged_prompts_gains_nothing",)),
    Mutation("generate-starts-from-a-secret-lead", "14.3", "a timed generate starts from a lead token sent only with it",
             (("worker/gates/bench.py", "sweep.leads[k] = secrets.randbelow(vocab)", "sweep.leads[k] = None"),),
             (R2 + "test_decoding_ahead_off_the_clock_gains_nothing",
              "tests/worker/gates/test_decode_steps.py::test_a_head_that_ignores_the_lead_token_is_caught")),
    Mutation("verification-teacher-forces-the-lead", "13.6", "the decode check teacher-forces the lead token first",
             (("worker/gates/verify.py", "        lead = s.lead if decode else None\n", "        lead = None\n"),),
             ("tests/worker/gates/test_decode_steps.py::test_the_decode_check_teacher_forces_the_lead_token_first",)),
    Mutation("fallocate-refused", "14.3", "fallocate cannot reserve host disk past RLIMIT_FSIZE",
             (("worker/sandbox/seccomp.py", 'OTHER_ERRNO = {"fallocate": errno.EOPNOTSUPP}', "OTHER_ERRNO = {}"),),
             (E + "test_fallocate_cannot_reserve_host_disk_past_the_file_size_limit",)),
    Mutation("cache-handover-follows-no-link", "14.2", "handing over the compile cache never follows a swapped-in link",
             (("worker/sandbox/process.py", "                        os.chown(name, uid, uid, dir_fd=dfd, follow_symlinks=False)",
               "                        os.lchown(os.path.join(_root, name), uid, uid)"),),
             (E + "test_handing_over_the_compile_cache_follows_no_link_swapped_in_mid_walk",)),
    Mutation("compile-cache-capped", "14.3", "a revision writing past its compile cache's cap is killed, the cache emptied",
             (("worker/harness/client.py", "        if self.writable:\n            proc = self.proc\n",
               "        if False:\n            proc = self.proc\n"),),
             (R + "test_filling_the_compile_cache_is_stopped_at_its_cap_and_wiped",)),
    Mutation("round-rereads-a-loser-before-reevaluating", "bot", "a push during a round keeps its new head's evaluation",
             (("bot/rounds.py", "    if still_at(session, service, pr, ev):\n        pr.base_sha = base_sha",
               "    if True:\n        pr.base_sha = base_sha"),),
             (RACES + "test_a_push_to_a_loser_while_the_round_closes_keeps_its_new_heads_evaluation",)),
    Mutation("refused-dispatch-sent-again", "bot", "a GPU task the broker refused is sent again, never charged to the PR",
             (("bot/service.py", "            ev.dispatched_at = None\n            session.commit()\n            raise",
               "            session.commit()\n            raise"),
              ("bot/service.py", "                if ev.unsent:\n", "                if False:\n"),
              ("bot/queue/watchdog.py", "        if ev.unsent:\n", "        if False:\n")),
             (RACES + "test_a_gpu_task_the_broker_refused_is_sent_again_by_the_deliverys_retry",
              RACES + "test_a_retry_the_broker_refused_is_sent_again_by_the_watchdog")),
    Mutation("round-reuses-a-finished-evaluation", "bot", "a round's request for a measured head and base reuses it",
             (("bot/service.py", "if trigger in (Trigger.AUTO, Trigger.APPROVAL, Trigger.ROUND):",
               "if trigger in (Trigger.AUTO, Trigger.APPROVAL):"),),
             ("tests/bot/test_rounds.py::test_a_rounds_request_for_a_head_and_base_already_measured_reuses_that_verdict",)),
    Mutation("round-closing-exclusive", "bot", "two beats closing one round merge once and write one outcome",
             (("bot/rounds.py", "query.with_for_update(skip_locked=True).execution_options", "query.execution_options"),),
             (RACES + "test_two_beats_closing_one_round_at_once_merge_once",)),
    Mutation("unrecorded-check-run-withdrawn", "bot", "a check run whose evaluation was not committed is not left queued",
             (("bot/service.py", "                withdraw_check(repo, created_check)\n", "                pass\n"),),
             ("tests/bot/test_faults.py::test_a_check_run_whose_evaluation_could_not_be_committed_is_not_left_queued",)),
    Mutation("dispatch-rereads-after-its-commit", "bot", "a result published during a dispatch is not shown as queued",
             (("bot/service.py", "        session.expire_all()\n        self.lock_pull(session, pr.id)",
               "        self.lock_pull(session, pr.id)"),),
             (RACES + "test_a_result_published_before_the_dispatcher_locks_the_pr_again_is_not_shown_as_queued",)),
    Mutation("delivery-claimed-before-its-handler", "bot", "a delivery is handled once though its dispatch commits",
             (("bot/queue/tasks.py", "        claim = _claim(delivery, settings)", "        claim = None"),),
             (RACES + "test_a_delivery_is_handled_once_though_its_dispatch_commits_in_the_middle",)),
    Mutation("evaluation-keyed-by-its-delivery", "bot", "a handler handled again finds the evaluation it asked for",
             (("bot/service.py", "        delivery_id = session.info.get(HANDLING_DELIVERY)",
               "        delivery_id = None"),),
             (RACES + "test_a_handler_killed_after_its_dispatch_commit_is_handled_again_without_a_second_evaluation",)),
    Mutation("stored-commit-goes-on", "bot", "a dispatch whose commit was stored but its answer lost goes on",
             (("bot/service.py", "            if attempt_stored(session, eval_id, attempt):",
               "            if False:"),),
             ("tests/bot/test_faults.py::test_an_evaluation_whose_commit_was_stored_but_its_answer_lost_goes_on",)),
    Mutation("own-unsent-attempt-sent-again", "bot", "a delivery's retry sends its own attempt whose task is nowhere",
             (("bot/service.py", "                elif self._own_attempt_never_sent(session, ev):",
               "                elif False:"),),
             (RACES + "test_a_handler_killed_between_its_dispatch_commit_and_the_send_is_handled_again_and_its_"
              "evaluation_runs", "tests/bot/test_faults.py::test_a_stored_commit_whose_answer_was_lost_while_the_"
              "database_restarts_is_sent_by_the_retry")),
    Mutation("sent-again-only-when-nowhere", "bot", "an attempt whose task is queued, running or done is not sent again",
             (("bot/queue/watchdog.py", "        return self.in_broker(task_id) or self.beating(task_id) or "
               "self.finished(task_id) is not None", "        return False"),),
             ("tests/bot/test_faults.py::test_an_attempt_its_delivery_finds_again_is_sent_again_only_when_its_task_is_nowhere",)),
    Mutation("sent-again-only-its-own-attempt", "bot", "a delivery's retry never sends an INFRA retry's attempt again",
             (("bot/service.py", " and ev.celery_task_id and ev.attempt == 1):", " and ev.celery_task_id):"),),
             (RACES + "test_a_deliverys_retry_does_not_send_again_an_infra_retry_its_dispatcher_is_still_sending",
              "tests/bot/test_faults.py::test_an_attempt_its_delivery_finds_again_is_sent_again_only_when_its_task_is_"
              "nowhere")),
    Mutation("sent-again-only-after-its-publish", "bot", "an attempt younger than send_in_flight_s is looked at later",
             (("bot/service.py", "        if age is not None and age < self.settings.send_in_flight_s:", "        if False:"),),
             ("tests/bot/test_faults.py::test_an_attempt_its_delivery_finds_again_is_sent_again_only_when_its_task_is_"
              "nowhere",)),
    Mutation("requeue-leaves-a-live-claim", "bot", "an operator's requeue does not hand out a delivery being handled",
             (("bot/queue/outbox.py", "        if claimed(d, now):\n            log.warning", "        if False:\n            log.warning"),),
             (RACES + "test_an_operators_requeue_does_not_hand_out_a_delivery_whose_handler_holds_its_claim",)),
    Mutation("failed-takes-back-only-its-claim", "bot", "a failed handler takes back its own claim, never another's",
             (("bot/queue/tasks.py", " or claimed(d, utcnow()) and d.outcome != claim:", ":"),),
             ("tests/bot/test_faults.py::test_a_failed_handler_takes_back_only_its_own_claim_and_a_refused_handle_task_counts_nothing",)),
    Mutation("rounds-closed-one-by-one", "bot", "a round that cannot be closed neither holds up nor undoes another's",
             (("bot/rounds.py", "            session.rollback()\n            log.exception(\"round %s: closing",
               "            raise\n            log.exception(\"round %s: closing"),),
             ("tests/bot/test_faults.py::test_a_round_that_cannot_be_closed_neither_holds_up_nor_undoes_another_repositorys",)),
    Mutation("round-stored-at-its-merge", "bot", "a round whose closer fails after its merge keeps that one winner",
             (("bot/rounds.py", "against the new base.\n        session.commit()\n", "against the new base.\n"),
              ("bot/rounds.py", 'notify(f"#{pr.number}\'s label", publish.add_label, gh, pr.number, MERGE_FIRST_LABEL)',
               "publish.add_label(gh, pr.number, MERGE_FIRST_LABEL)")),
             ("tests/bot/test_faults.py::test_a_round_whose_closer_fails_after_its_merge_has_that_one_winner",)),
    Mutation("lost-merge-answer-still-wins", "bot", "a merge whose answer GitHub lost is still the round's winner",
             (("bot/rounds.py", "lost the answer (the client's retried PUT then met a 405).\n                merged_sha = "
               "merged_at(gh, pr.number, ev.head_sha)", "lost the answer (the client's retried PUT then met a 405).\n"
               "                merged_sha = None"),),
             ("tests/bot/test_faults.py::test_a_merge_whose_answer_github_lost_is_still_the_rounds_winner",)),
    Mutation("visibility-asked-again", "bot", "a repository made private leaves the dashboard within RECHECK_S",
             (("bot/web/access.py", "    if row is not None and utcnow() - row.checked_at < timedelta(seconds=RECHECK_S):",
               "    if row is not None:"),),
             ("tests/bot/web/test_injection.py::test_a_repository_made_private_is_hidden_once_its_visibility_is_rechecked",)),
    Mutation("repository-path-is-no-pattern", "bot", "% and _ in a dashboard path match no repository",
             (("bot/web/views.py", "func.lower(Repository.full_name) == full_name.lower()",
               "Repository.full_name.ilike(full_name)"),),
             ("tests/bot/web/test_injection.py::test_like_wildcards_in_a_repository_path_match_nothing",)),
    Mutation("sticky-fits-githubs-limit", "bot", "the sticky comment stays under GitHub's size limit",
             (("bot/render.py", "        if comment_length(body) <= COMMENT_LIMIT or not shown:", "        if True:"),),
             ("tests/bot/render/test_injection.py::test_the_sticky_comment_fits_githubs_size_limit",)),
    Mutation("lapsed-claim-handled-again", "bot", "a handler that died mid-way is handled again when its claim lapses",
             (("bot/queue/outbox.py", "            d.outcome = None  # due", "            pass  # due"),),
             ("tests/bot/test_faults.py::"
              "test_a_handler_that_died_after_its_dispatch_committed_is_handled_again_once_its_claim_lapses",)),
    Mutation("history-keyed-by-hardware", "13.1", "A/A history is keyed by GPU UUID, driver, torch/triton, not hostname",
             (("worker/calibration/key.py",
               "    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]",
               '    digest = __import__("socket").gethostname()'),),
             ("tests/worker/calibration/test_history.py::test_key_is_the_hardware_and_software_not_the_hostname",)),
    Mutation("floor-is-the-measured-spread", "13.3", "the floor follows the A/A spread, not a 2 % minimum",
             (("worker/config.py", "    noise_floor_min: float = 0.001", "    noise_floor_min: float = 0.02"),),
             ("tests/worker/gates/test_noise.py::test_floor_is_the_measured_spread_not_a_fixed_minimum",)),
    Mutation("sandbox-tests-fail-where-required", "CI", "a `sandbox` test fails, not skips, under "
             "TOKENGATE_REQUIRE_SANDBOX=1 (.ci/run) on a host without the sandbox",
             (("tests/conftest.py", '        if os.environ.get("TOKENGATE_REQUIRE_SANDBOX") == "1":',
               "        if False:"),),
             ("tests/test_timed_alone.py::test_a_sandbox_test_skips_where_the_sandbox_is_missing_and_fails_where_it_is_required",)),
    Mutation("sandboxed-revisions-need-the-marker", "CI", "a test that starts revision processes in the full "
             "sandbox must be marked `sandbox`", (("tests/conftest.py", "    if sandboxed and request.node."
                                                  'get_closest_marker("sandbox") is None:', "    if False:"),),
             ("tests/test_timed_alone.py::test_a_test_that_starts_revisions_must_be_marked_timed_and_sandbox",)),
    Mutation("expert-slot-reads-its-own-int8-row", "17", "on the int8-x expert paths each slot's down GEMV reads "
             "its own quantized activation row and scales", (("runtime/kernels/moe_experts/gemv_path.py",
                                                              "p_ds + j * (K // 32) * 4", "p_ds"),),
             ("tests/runtime/kernels/test_moe_gemv_path.py::"
              "test_int8_x_paths_are_the_arithmetic_on_the_dequantized_int8_x",)),
    Mutation("expert-rows-of-the-chosen-expert", "17", "the expert GEMVs on the dense paths read only the chosen "
             "experts' rows", (("runtime/kernels/moe_experts/gemv_path.py",
                                "g, u, ss = _gate_up(p_g, p_u, stride_g, stride_u, e * N + local,",
                                "g, u, ss = _gate_up(p_g, p_u, stride_g, stride_u, local,"),),
             ("tests/runtime/kernels/test_moe_gemv_path.py::test_only_the_chosen_experts_are_read",)),
    Mutation("expert-sort-no-host-read", "17", "the MoE prefill's expert sort reads nothing back to the host "
             "(torch.bincount read the ids' min and max, twice a layer)",
             (("runtime/kernels/moe_experts/kernel.py", "    counts = torch.zeros(n_expert, dtype=torch.long, "
               "device=ids.device).scatter_add_(0, flat, torch.ones_like(flat))",
               "    counts = torch.bincount(flat, minlength=n_expert)"),),
             ("tests/runtime/kernels/test_moe.py::test_sort_by_expert_never_reads_back_to_the_host",
              "tests/runtime/triton/test_moe_engine.py::test_moe_prefill_ffn_reads_nothing_back_to_the_host")),
    Mutation("folded-shared-expert-gated", "17", "a shared expert folded into the expert launches is weighed by "
             "sigmoid of its gate logit", (("runtime/kernels/moe_experts/gemv_path.py",
                                            "        w = tl.sigmoid(tl.load(p_slogit))", "        w = tl.load(p_slogit)"),),
             ("tests/runtime/kernels/test_moe_gemv_path.py::test_the_shared_expert_folds_in_as_the_last_slot",)),
    Mutation("folded-shared-expert-summed", "17", "the split down launch's sum adds the folded shared expert's part",
             (("runtime/kernels/moe_experts/kernel.py", "d, KSEL=slots, HAS_SHARED=has_shared", "d, KSEL=k, "
               "HAS_SHARED=has_shared"),),
             ("tests/runtime/kernels/test_moe_gemv_path.py::test_the_shared_expert_folds_in_as_the_last_slot",)),
    Mutation("default-fold-by-width", "17", "the default expert tile folds the shared expert in only where it is as "
             "wide as a routed expert (elsewhere a MoE would fail to decode)",
             (("runtime/kernels/moe_experts/kernel.py", "return DEFAULT_EXPERT_TILE if d_ffn_exp == d_ffn_shexp else",
               "return DEFAULT_EXPERT_TILE if True else"),),
             ("tests/runtime/triton/test_moe_engine.py::"
              "test_the_default_expert_tile_folds_the_shared_expert_only_where_it_is_as_wide",)),
    Mutation("grouped-idle-tiles-exit", "17", "a grouped-GEMM tile past the last expert group leaves at once, "
             "dequantizing nothing (up to E such tiles a prefill layer)",
             (("runtime/kernels/moe_experts/kernel.py",  # the down kernel back to masking its idle tiles
               "BM: tl.constexpr, BN: tl.constexpr, DOT_BF16: tl.constexpr):\n    i_t, i_n = tl.program_id(0), "
               "tl.program_id(1)\n    e = tl.load(p_tile_e + i_t)\n    if e >= E:",
               "BM: tl.constexpr, BN: tl.constexpr, DOT_BF16: tl.constexpr):\n    i_t, i_n = tl.program_id(0), "
               "tl.program_id(1)\n    e = tl.load(p_tile_e + i_t)\n    if e >= E + 1:"),
              ("runtime/kernels/moe_experts/kernel.py", "    e64 = e.to(tl.int64)\n    r = i_t * BM + tl.arange(0, BM)"
               "\n    slot = tl.load(p_slot + r)\n    mask_m = slot >= 0\n    offs_n = i_n * BN + tl.arange(0, BN)\n"
               "    mask_n = offs_n < N\n    rows = e64 * N + offs_n\n    l = tl.arange(0, 32)\n    p_arow",
               "    e64 = tl.minimum(e, E - 1).to(tl.int64)\n    r = i_t * BM + tl.arange(0, BM)"
               "\n    slot = tl.load(p_slot + r)\n    mask_m = slot >= 0\n    offs_n = i_n * BN + tl.arange(0, BN)\n"
               "    mask_n = (offs_n < N) & (offs_n * 0 + e < E)\n    rows = e64 * N + offs_n\n    l = tl.arange(0, 32)\n    p_arow")),
             ("tests/runtime/kernels/test_moe.py::test_grouped_tiles_past_the_last_group_dequantize_nothing",)),
    Mutation("missing-history-named", "13", "a placebo pool that names a missing A/A history fails naming it",
             (("bench/worker/gpu_calibration.py", "    if not Path(path).is_file():", "    if False:"),),
             ("tests/bench/worker/test_gpu_calibration_pool.py::test_a_missing_history_is_named_and_not_created",)),
    Mutation("guard-failure-settles", "13", "a failed accuracy guard is REJECT at once: no gate timed, no later "
             "model loaded", (("worker/pipeline.py", "            why = self._settled({spec.name: out})",
                               "            why = None"),),
             ("tests/worker/gates/test_gates.py::test_subtly_wrong_kernel_fails_the_guard_and_nothing_is_timed_after_it",)),
    Mutation("settled-stops-later-models", "13", "a settled verdict loads no later model",
             (("worker/pipeline.py", "                        why = self._settled(outcomes)",
               "                        why = None"),),
             ("tests/worker/gates/test_gates.py::test_subtly_wrong_kernel_fails_the_guard_and_nothing_is_timed_after_it",)),
    Mutation("slower-only-checks-one-rep", "19", "a model slower on some gate and faster on none is checked on the "
             "first pair's verified rep only", (("worker/pipeline.py", "partly = no_pass_possible(spec.name, gates, "
                                                  "sweeps, nulls)", "partly = None"),),
             ("tests/worker/gates/test_gates.py::test_real_slowdown_is_rejected_naming_the_gate",)),
    Mutation("faster-gate-checks-every-pair", "13", "a model with a faster gate has every pair's outputs checked",
             (("worker/gates/judge.py", "if not slower or any(side > 0 for side in sides.values()):",
               "if not slower:"),),
             ("tests/worker/verdicts/test_trust.py::test_decode_speedup_with_prefill_regression_is_mixed_not_a_tier",)),
    Mutation("skipped-check-keeps-base-bars", "13", "where output checks are cut short, base is still held to its "
             "bars on the verified rep (a broken main is INFRA)",
             (("worker/pipeline.py", "            del pending[1:]\n            verify(every_rep=False)",
               "            del pending[:]"),),
             ("tests/worker/verdicts/test_trust.py::test_a_fix_of_a_broken_main_that_costs_speed_is_not_blamed_on_the_pr",)),
    Mutation("checks-eager-when-no-gate-can-slow", "19", "each pair is checked before the next is timed while no gate "
             "can end slower (one pair's per-step logits held at a time)",
             (("worker/pipeline.py", "                verify()  # no gate can end slower",
               "                pass  # no gate can end slower"),),
             ("tests/worker/gates/test_gates.py::test_real_speedup_gets_a_tier",)),
    Mutation("aa-run-never-settles", "13", "an A/A calibration run never stops early on a settled verdict",
             (("worker/pipeline.py", "        if self.record_aa:\n            return None\n        done",
               "        done"),),
             ("tests/worker/calibration/test_calibration.py::"
              "test_a_guard_failing_by_chance_in_an_aa_run_stops_no_model_from_recording",)),
    Mutation("confirming-pairs-narrow", "19", "with every gate in play slower and none faster, confirming pairs "
             "first time the shortest context and the gate furthest beyond its floor only",
             (("worker/gates/confirm.py", "    if not wanting or faster or narrowed:", "    if True:"),),
             ("tests/worker/gates/test_gates.py::"
              "test_confirming_pairs_of_a_slowdown_time_the_shortest_context_and_the_furthest_gate",
              "tests/worker/gates/test_confirm.py::"
              "test_every_gate_slower_keeps_the_shortest_context_and_the_gate_furthest_beyond_its_floor")),
    Mutation("confirming-pairs-skip-decided", "19", "a confirming pair never times a gate already decided",
             (("worker/pipeline.py", "self._sweep(pair, plan.timed, vocab", "self._sweep(pair, gates, vocab"),),
             ("tests/worker/gates/test_gates.py::"
              "test_confirming_pairs_of_a_slowdown_time_the_shortest_context_and_the_furthest_gate",)),
    Mutation("left-out-gates-come-back", "19", "if the kept gates come to nothing, the gates left out are timed "
             "after all (a decoy gate cannot steer a real regression out of the confirmation)",
             (("worker/gates/confirm.py",
               "        return ConfirmPlan([g for g in wanting if g.name in left_out], {}, True)",
               "        return ConfirmPlan([], left_out, True)"),),
             ("tests/worker/gates/test_gates.py::"
              "test_a_decoy_gate_cannot_steer_a_real_regression_out_of_the_confirmation",
              "tests/worker/gates/test_confirm.py::test_the_narrowed_confirmation_decides_as_the_full_design_does")),
    Mutation("left-out-gates-come-back-e2e", "19", "the same rule through a whole evaluation: the decoy head is "
             "REJECTed on its real regression (the test above stops at the first failure, test_confirm.py's)",
             (("worker/gates/confirm.py",
               "        return ConfirmPlan([g for g in wanting if g.name in left_out], {}, True)",
               "        return ConfirmPlan([], left_out, True)"),),
             ("tests/worker/gates/test_gates.py::"
              "test_a_decoy_gate_cannot_steer_a_real_regression_out_of_the_confirmation",)),
    Mutation("narrowed-once", "19", "the gates left out are timed together, never narrowed again (at most 1 + 2 (m - 1) "
             "pairs)",
             (("worker/gates/confirm.py", "    if not wanting or faster or narrowed:", "    if not wanting or faster:"),),
             ("tests/worker/gates/test_confirm.py::"
              "test_a_kept_gate_that_confirms_ends_the_model_and_kept_gates_that_miss_bring_the_rest_back",)),
    Mutation("settled-slower-stops-confirming", "19", "a model already significantly slower with no gate faster gets no "
             "more confirming pairs",
             (("worker/gates/confirm.py", "    if slower and not faster:  # significantly", "    if False:  # significantly"),),
             ("tests/worker/gates/test_confirm.py::"
              "test_a_gate_already_significantly_slower_with_none_faster_ends_the_model",)),
    Mutation("timed-tests-alone", "CI", "under xdist a timed test shares the machine with no other test",
             (("tests/conftest.py", "fcntl.LOCK_EX if alone else fcntl.LOCK_SH", "fcntl.LOCK_SH"),),
             ("tests/test_timed_alone.py::test_timed_tests_overlap_nothing_under_xdist",)),
)


def apply(tree: Path, m: Mutation) -> dict[Path, str]:
    """Apply m's edits in tree; returns the originals. Raises LookupError when an edit is stale."""
    originals: dict[Path, str] = {}
    for rel, old, new in m.edits:
        path = tree / rel
        current = path.read_text()
        originals.setdefault(path, current)  # the first read: before any of m's edits
        if current.count(old) != 1:
            restore(originals)
            raise LookupError(f"{rel}: the text to remove occurs {current.count(old)} times (want 1): {old!r}")
        path.write_text(current.replace(old, new))
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        path.write_text(text)


def _child_env(tree: Path) -> dict[str, str]:
    """The tree's own modules first; none of a calling pytest's PYTEST_* (its child is not one of its workers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return {**env, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[int | None, str, list[str]]:
    """pytest in one process on the tree's own modules; (exit code or None on timeout, output tail, the ids of
    the tests that failed). It stops at the first failure (-x): a killed row names the test that killed it, not
    every named test that would have."""
    env = _child_env(tree)
    # In path order: each package's tests together, so a package-scoped fixture (tests/bot's Celery worker) is set
    # up once; ids in table order left tests/bot, then came back to an app whose broker pool had been closed.
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=",
           *sorted(dict.fromkeys(tests))]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return None, f"timed out after {timeout:.0f} s: {(exc.stdout or '')[-800:]}", []
    failed = [line.split()[1] for line in r.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return r.returncode, (r.stdout + r.stderr)[-1500:], failed


def check_one(tree: Path, m: Mutation, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        originals = apply(tree, m)
    except LookupError as exc:
        return {"id": m.id, "outcome": "stale", "why": str(exc), "seconds": 0.0}
    try:
        rc, tail, failed = run_tests(tree, m.tests, timeout)
    finally:
        restore(originals)
    outcome = {1: "killed", 0: "survived"}.get(rc, "error")
    row = {"id": m.id, "outcome": outcome, "pytest_exit": rc, "seconds": round(time.monotonic() - t0, 1)}
    if outcome == "killed":
        row["killed_by"] = failed
    else:
        row["output_tail"] = tail
    return row


def imports_from(tree: Path) -> str:
    """Where the tree's python resolves `worker` (must be the tree, not an installed checkout)."""
    return subprocess.run([sys.executable, "-c", "import worker; print(worker.__file__)"], cwd=tree, env=_child_env(tree),
                          capture_output=True, text=True, check=True).stdout.strip()


def check(mutations: tuple[Mutation, ...], tree: Path, timeout: float = 600.0, log=print) -> dict:
    where = imports_from(tree)
    if not where.startswith(str(tree)):
        raise SystemExit(f"the clone imports worker from {where}, not from {tree}")
    tests = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
    rc, tail, _ = run_tests(tree, tests, timeout)
    if rc != 0:
        raise SystemExit(f"the guarding tests do not pass on the unmutated tree (exit {rc}):\n{tail}")
    rows = []
    for m in mutations:
        row = check_one(tree, m, timeout)
        log(f"{row['outcome']:>8}  {m.id}  ({row['seconds']} s)")
        rows.append({**row, "issue": m.issue, "rule": m.rule, "tests": list(m.tests),
                     "edits": [{"path": p, "old": o, "new": n} for p, o, n in m.edits]})
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("killed", "survived", "error", "stale")}
    return {"kind": "mutation_check", "mutations": rows, "counts": counts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated mutation ids")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
    ap.add_argument("--out", default=str(ROOT / "bench" / "receipts"))
    args = ap.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.id:32} {m.issue:5} {m.rule}")
        return 0
    wanted = {x for x in args.only.split(",") if x}
    unknown = wanted - {m.id for m in MUTATIONS}
    if unknown:
        ap.error(f"unknown mutation ids: {', '.join(sorted(unknown))}")
    chosen = tuple(m for m in MUTATIONS if not wanted or m.id in wanted)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tokengate-mutants-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(tree)], check=True)
        out = check(chosen, tree, args.timeout)
    import platform

    import torch

    out.update(commit=commit, seconds=round(time.monotonic() - t0, 1), n=len(chosen),
               host={"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                     "machine": platform.machine()},
               created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"mutation-check-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    c = out["counts"]
    print(f"{c['killed']} of {len(chosen)} killed, {c['survived']} survived, {c['error']} errors, "
          f"{c['stale']} stale in {out['seconds']} s; receipt {path}")
    return 0 if c["killed"] == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
