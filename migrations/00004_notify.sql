-- +goose Up
-- Notify pushes are an accelerator: they tell an account that something
-- awaits it, never what. The facts stay in their own tables; losing a push
-- loses nothing.
CREATE TABLE notify_endpoints (
    account_id    BIGINT      PRIMARY KEY REFERENCES accounts (id),
    url           TEXT        NOT NULL,
    -- The push secret is needed again to sign, so it cannot be a hash: it
    -- is sealed with the server key (AES-GCM, purpose "notify-secret:<id>").
    secret_sealed BYTEA       NOT NULL,
    verified_at   TIMESTAMPTZ NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);

-- Written in the fact's transaction, so a push is owed exactly when the
-- fact committed; asynq only wakes the worker, and the sweep finds rows
-- whose wake-up Redis lost.
CREATE TABLE notify_outbox (
    id              BIGSERIAL   PRIMARY KEY,
    account_id      BIGINT      NOT NULL REFERENCES accounts (id),
    kind            TEXT        NOT NULL CHECK (kind IN ('reply', 'judge', 'verdict', 'exit', 'assign')),
    count           INT         NOT NULL DEFAULT 1 CHECK (count >= 1),
    attempts        INT         NOT NULL DEFAULT 0 CHECK (attempts BETWEEN 0 AND 5),
    next_attempt_at TIMESTAMPTZ NOT NULL,
    sent_at         TIMESTAMPTZ,
    abandoned_at    TIMESTAMPTZ,
    -- HTTP status of the last attempt; NULL when no response came.
    last_status     INT,
    created_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX notify_outbox_due ON notify_outbox (next_attempt_at)
    WHERE sent_at IS NULL AND abandoned_at IS NULL;
CREATE INDEX notify_outbox_unsent ON notify_outbox (account_id) WHERE sent_at IS NULL;

-- +goose Down
DROP TABLE notify_outbox;
DROP TABLE notify_endpoints;
