-- leases: named leadership leases on the database clock. The supervisor's
-- leader holds "supervisor"; a holder that stops renewing loses it when
-- expires_at passes, whether it crashed or hangs.
CREATE TABLE leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    epoch      bigint      NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
