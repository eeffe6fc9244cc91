"""``inferd tune``: a measured search for a model's serving config (issue 30), as Triton's Model
Analyzer does it, with inferd's own C++ load generator driving a real inferd. It tries the least
risky changes first (batching, then instances, then ONNX Runtime's threads, then precision),
keeps a change only when it measurably helps, and reports every config it tried with its
throughput, latency percentiles, server CPU per inference, memory, cold start, errors and cost per
1,000 predictions, a throughput-against-p99 plot and the best config.pbtxt."""
