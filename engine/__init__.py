"""The detection engine: :class:`~failslow.engine.analyzer.JobAnalyzer` runs every detector,
the what-if analysis and the mitigation planner on one job's record batches; the stream
processor drives it online and :func:`~failslow.engine.offline.analyze` replays a trace
directory through it in the same windows (a batch is a stream replayed)."""
