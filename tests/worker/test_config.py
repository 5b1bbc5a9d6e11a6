from worker.config import EvalSettings


def test_with_profile_replaces_one_profiles_fields_and_leaves_the_rest():
    s = EvalSettings(profile="quick")
    t = s.with_profile("quick", max_process_pairs=6, prompts_per_seed=1)
    assert (t.profile_settings("quick").max_process_pairs, t.profile_settings("quick").prompts_per_seed) == (6, 1)
    assert t.profile_settings("quick").models == s.profile_settings("quick").models
    assert t.profile_settings("standard") == s.profile_settings("standard")
    assert s.profile_settings("quick").max_process_pairs != 6  # the settings it came from are unchanged
