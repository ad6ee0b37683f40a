"""Mitigation planning (Greyhound §5): the ski-rental planner and its S2 micro-batch and S3
topology plans."""
