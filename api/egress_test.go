package api

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEgressWireForm(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Egress
		err  string
	}{
		{in: `"default"`, want: Egress{Mode: EgressDefault}},
		{in: `"none"`, want: Egress{Mode: EgressNone}},
		{in: `["10.0.0.0/8:443","1.2.3.4:53"]`, want: Egress{Mode: EgressAllow, Allow: []string{"10.0.0.0/8:443", "1.2.3.4:53"}}},
		{in: `[]`, want: Egress{Mode: EgressAllow, Allow: []string{}}},
		{in: `"all"`, err: `not "all"`},
		{in: `42`, err: "array"},
	} {
		var e Egress
		err := json.Unmarshal([]byte(tc.in), &e)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, e, tc.in)
		b, err := json.Marshal(e)
		require.NoError(t, err)
		require.JSONEq(t, tc.in, string(b))
	}
}

func TestEgressRules(t *testing.T) {
	rules, err := Egress{Mode: EgressAllow, Allow: []string{"10.1.2.3/8:443", "1.2.3.4:53"}}.Rules()
	require.NoError(t, err)
	require.Equal(t, "10.0.0.0/8:443", rules[0].String(), "the prefix is masked")
	require.Equal(t, "1.2.3.4/32:53", rules[1].String())
	for _, bad := range []string{"10.0.0.0/8", "10.0.0.0/8:0", "10.0.0.0/8:70000", "example.com:80", "[::1]:80", "::/0:443", "10.0.0.0/33:1"} {
		_, err := Egress{Mode: EgressAllow, Allow: []string{bad}}.Rules()
		require.Error(t, err, bad)
		require.Equal(t, KindInvalidRequest, AsError(err).Kind, bad)
	}
	many := make([]string, MaxEgressRules+1)
	for i := range many {
		many[i] = "10.0.0.1:80"
	}
	_, err = Egress{Mode: EgressAllow, Allow: many}.Rules()
	require.ErrorContains(t, err, "at most")
}

func TestEgressArgInCatalog(t *testing.T) {
	op, ok := LookupOp("create_workspace_session")
	require.True(t, ok)
	for _, v := range []any{"none", "default", []any{"10.0.0.0/8:443"}, []any{}} {
		require.Nil(t, op.Validate(map[string]any{"egress": v}), "%v", v)
	}
	for _, v := range []any{"everything", 3, []any{1}, map[string]any{}} {
		require.NotNil(t, op.Validate(map[string]any{"egress": v}), "%v", v)
	}
	p := op.ArgsSchema()["properties"].(map[string]any)["egress"].(map[string]any)
	require.NotContains(t, p, "type")
	require.Len(t, p["oneOf"], 2)
	require.Equal(t, 429, HTTPStatus(KindResourceExhausted))
	require.True(t, IsKind(KindResourceExhausted))
}
