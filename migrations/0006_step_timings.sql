-- The agent's own clock readings for a step's latest attempt, from its
-- reply: when it took the request, how long the remote call took (retries
-- included) and when it sent the reply. They only explain latency (sasctl
-- bench's per-stage breakdown); nothing decides on them, and they are not
-- on the database clock.
ALTER TABLE steps
    ADD COLUMN agent_started_at timestamptz,
    ADD COLUMN agent_call_us bigint CHECK (agent_call_us >= 0),
    ADD COLUMN agent_sent_at timestamptz;
