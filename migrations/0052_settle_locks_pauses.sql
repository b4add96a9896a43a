-- The leader's settling of pauses (pauses_settle) locks each pause row
-- it sets steps aside for (FOR SHARE), so that a resume deleting that
-- row meanwhile never leaves the order's steps set aside with nothing
-- left to free them; a row lock needs UPDATE on a column of the table.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'sas_supervisor') THEN
        GRANT UPDATE (scope) ON order_pauses TO sas_supervisor;
    END IF;
END
$$;
