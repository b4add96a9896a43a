-- A compensation runs only for an action its service may have done.
--
-- steps.unsent_attempts counts the attempts of a step that sas answered
-- itself before any request for it left: a scheduler that claimed the
-- step found its when false or failing, its for_each list or its input
-- failing, or its child refused (step_fail_unsent, step_skip,
-- step_expand). An action whose every attempt was so answered
-- (attempt <= unsent_attempts) never reached its service: its
-- compensation is cancelled ("its action never ran") and the ending event
-- does not list it as undone. Any other attempt may have reached it (a
-- request published, or a scheduler that died between its claim and its
-- publish): that is the conservative side, and its compensation runs.
ALTER TABLE steps ADD COLUMN unsent_attempts integer NOT NULL DEFAULT 0 CHECK (unsent_attempts >= 0);

-- An operator's change or reset of a kind's limits also ends a rate
-- lowering a service's 429 made: the operator's word is the last.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_operator') THEN
        GRANT UPDATE (lowered_rate, lowered_until) ON agent_limits TO sas_operator;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_console') THEN
        GRANT UPDATE (lowered_rate, lowered_until) ON agent_limits TO sas_console;
    END IF;
END
$$;
