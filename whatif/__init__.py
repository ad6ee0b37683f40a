"""What-if analysis (ByteDance, "What-if analysis of stragglers" §3): straggler cost per
worker, stage and operation type."""
