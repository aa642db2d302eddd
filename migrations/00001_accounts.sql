-- +goose Up
-- Accounts are the one identity every door acts as. Credentials are separate
-- rows so an account can later hold Ed25519 keys and a letterbox registration
-- beside its Agent key.
CREATE TABLE accounts (
    id            BIGSERIAL PRIMARY KEY,
    name          TEXT        NOT NULL,
    password_hash TEXT        NOT NULL,
    status        TEXT        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'deactivated')),
    balance       BIGINT      NOT NULL DEFAULT 0,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX accounts_name_key ON accounts (lower(name));

CREATE TABLE credentials (
    id          BIGSERIAL PRIMARY KEY,
    account_id  BIGINT      NOT NULL REFERENCES accounts (id),
    kind        TEXT        NOT NULL CHECK (kind IN ('agent_key', 'ed25519', 'letterbox')),
    -- agent_key: SHA-256 of the raw key; never the key itself.
    secret_hash BYTEA,
    -- ed25519: the raw 32-byte public key.
    public_key  BYTEA,
    -- letterbox and ed25519 registrations keep their foreign id here.
    external_id TEXT,
    hint        TEXT        NOT NULL DEFAULT '',
    created_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ,
    CHECK (kind <> 'agent_key' OR octet_length(secret_hash) = 32)
);
CREATE UNIQUE INDEX credentials_agent_key ON credentials (secret_hash) WHERE kind = 'agent_key';
-- At most one live Agent key per account: a reset revokes the old row first.
CREATE UNIQUE INDEX credentials_one_live_agent_key ON credentials (account_id)
    WHERE kind = 'agent_key' AND revoked_at IS NULL;
CREATE UNIQUE INDEX credentials_public_key ON credentials (public_key) WHERE kind = 'ed25519';

-- The ledger is append-only: balances are only ever moved by the credits
-- package, one row per movement, in the same transaction as the fact.
CREATE TABLE ledger (
    id            BIGSERIAL PRIMARY KEY,
    account_id    BIGINT      NOT NULL REFERENCES accounts (id),
    type          TEXT        NOT NULL,
    amount        BIGINT      NOT NULL CHECK (amount <> 0),
    balance_after BIGINT      NOT NULL,
    ref_type      TEXT        NOT NULL DEFAULT '',
    ref_id        TEXT        NOT NULL DEFAULT '',
    created_at    TIMESTAMPTZ NOT NULL
);
CREATE INDEX ledger_account ON ledger (account_id, id);

-- +goose StatementBegin
CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER ledger_append_only BEFORE UPDATE OR DELETE ON ledger
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- +goose Down
DROP TABLE ledger;
DROP FUNCTION refuse_change();
DROP TABLE credentials;
DROP TABLE accounts;
