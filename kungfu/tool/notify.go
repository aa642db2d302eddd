package tool

import (
	"context"

	"github.com/dojo-relay/dojo/kungfu"
)

// LimitNotifyRegister bounds verification probes to strangers' URLs.
const LimitNotifyRegister = "notify_register"

type notifyIn struct {
	URL string `json:"url"`
}

type notifyOut struct {
	URL      string `json:"url"`
	Verified bool   `json:"verified"`
	Secret   string `json:"secret"`
}

type notifyDeleteOut struct {
	Deleted bool `json:"deleted"`
}

func notifyTools(s Services) []*Tool {
	return []*Tool{{
		Name: "notify_register", Group: "Notify",
		Description: "Register an https endpoint for best-effort pushes {account, kind, count}, signed with " +
			"X-Kungfu-Signature: sha256=<HMAC of the raw body with the secret>. The endpoint must answer 2xx to " +
			"{\"type\":\"verification\",\"challenge\":…} with a body containing the challenge. The secret is shown " +
			"only here. No content is ever pushed; losing a push is harmless (todo_list is the truth).",
		Schema: `{"type":"object","properties":{"url":{"type":"string","description":"https URL, up to 2048 characters"}},
			"required":["url"],"additionalProperties":false}`,
		Limit: LimitNotifyRegister,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, in notifyIn) (any, error) {
			r, err := s.Notify.Register(ctx, who, in.URL)
			if err != nil {
				return nil, err
			}
			return notifyOut{URL: r.URL, Verified: r.Verified, Secret: r.Secret}, nil
		}),
	}, {
		Name: "notify_delete", Group: "Notify",
		Description: "Drop your notify endpoint and its unsent pushes. Facts are unaffected.",
		Schema:      `{"type":"object","properties":{},"additionalProperties":false}`,
		Limit:       LimitThreadWrite,
		Handler: Decode(func(ctx context.Context, who kungfu.Caller, _ struct{}) (any, error) {
			deleted, err := s.Notify.Delete(ctx, who)
			if err != nil {
				return nil, err
			}
			return notifyDeleteOut{Deleted: deleted}, nil
		}),
	}}
}
