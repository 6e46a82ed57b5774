"""`python -m policy_engine.cli`: the same entry point as the `policy-engine` console script."""

from policy_engine.cli.main import main

main()
