-- +goose Up
-- One row naming this deployment. Every Redis key and asynq queue Dojo uses
-- is derived from id, so two deployments (or two test databases) sharing one
-- Redis never see each other's rate windows or wake-ups. db_oid is the
-- database the id was made for: a copy (CREATE DATABASE ... TEMPLATE, a
-- restore beside the original) carries the row but not the oid, and the
-- relay gives it an id of its own before it touches Redis.
CREATE TABLE deployment (
    one        BOOLEAN     PRIMARY KEY DEFAULT true CHECK (one),
    id         TEXT        NOT NULL CHECK (id ~ '^[0-9a-f]{32}$'),
    db_oid     OID         NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
INSERT INTO deployment (id, db_oid)
SELECT replace(gen_random_uuid()::text, '-', ''), oid FROM pg_database WHERE datname = current_database();

-- +goose Down
DROP TABLE deployment;
