package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dojo-relay/dojo/kungfu/kungfutest"
	"github.com/dojo-relay/dojo/migrations"
)

// A freshly migrated database names itself: one random deployment id,
// bound to this database's oid, different in every database.
func TestMigrateMakesDeploymentID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, kungfutest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	ids := map[string]bool{}
	for range 2 {
		var b [6]byte
		_, _ = rand.Read(b[:])
		name := "dojo_t_" + hex.EncodeToString(b[:])
		if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
		u, _ := url.Parse(kungfutest.AdminURL())
		u.Path = "/" + name
		if _, err := migrations.Up(ctx, u.String()); err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		var id string
		var bound bool
		err = conn.QueryRow(ctx, `SELECT id, db_oid = (SELECT oid FROM pg_database WHERE datname = current_database())
			FROM deployment`).Scan(&id, &bound)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(id) || !bound || ids[id] {
			t.Fatalf("deployment id %q, bound to this database %v, seen before %v", id, bound, ids[id])
		}
		ids[id] = true
	}
}
