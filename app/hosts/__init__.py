"""Rigs of several machines (issue 21): the hosts of a profile (:mod:`app.hosts.spec`),
the line-delimited JSON protocol (:mod:`app.hosts.protocol`), the agent that runs on each
host (:mod:`app.hosts.agent`, ``vllm-dyno agent``) and the app's side of it over SSH or a
local pipe (:mod:`app.hosts.link`). See docs/design.md, "Hosts and the agent"."""
