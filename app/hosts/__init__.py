"""Rigs of several machines (issue 21): the hosts of a profile (:mod:`app.hosts.spec`),
the line-delimited JSON protocol (:mod:`app.hosts.protocol`), the agent that runs on each
host (:mod:`app.hosts.agent`, ``vllm-dyno agent``), the app's side of it over SSH or a
local pipe (:mod:`app.hosts.link`) and for thread-based callers (:mod:`app.hosts.rig`),
the checks before a multi-host launch (:mod:`app.hosts.checks`) and the launch plan of
the mp backend (:mod:`app.hosts.plan`). See docs/design.md, "Hosts and the agent"."""
