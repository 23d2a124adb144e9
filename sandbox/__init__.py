"""The sandbox: running untrusted programs against their tests, isolated (`sandbox.verifier.Verifier`).

Beside ``models/`` (the learning code) rather than in it: namespaces, mounts, cgroups and uids are systems code.
``verifier`` is the interface (a pool of workers, verdicts with per-test results, reward V2); ``worker`` is the
standard-library-only process the verifier starts per pool slot (isolation, the two forked processes of a run);
``harness`` is the test transform and the verdict protocol both sides share.
"""
