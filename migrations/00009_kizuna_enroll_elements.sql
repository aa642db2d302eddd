-- +goose Up
-- The elements an admin mints an enroll token with (name, agent_id,
-- capabilities, webhook_url, and the optional capability_tags and
-- agent_card): registering with the token fills whatever the body leaves
-- out, so the install script can send {}. NULL for tokens minted before.
ALTER TABLE kz_enroll_tokens ADD COLUMN elements JSON;

-- +goose Down
ALTER TABLE kz_enroll_tokens DROP COLUMN elements;
