"""What every family of reproducers shares: exit codes, the CLI contract (cli), the ranks' launch and teardown
(launch), their environment (env), sp/dp groups (topology), the engine's config (engine), the one scale rule
(scales), the reports' bases (report), the results' writer (files) and how to tell the fix is in (fixed)."""
