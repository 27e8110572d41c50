import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { OpError, resume, signIn, signOut } from "./api";
import { href, parseRoute, Route } from "./lib";
import { Files } from "./pages/Files";
import { Fleet } from "./pages/Fleet";
import { Health } from "./pages/Health";
import { Sandbox } from "./pages/Sandbox";
import { Terminal } from "./pages/Terminal";
import "./style.css";

function useRoute(): Route {
  const [r, setR] = useState(parseRoute(location.hash));
  useEffect(() => {
    const on = () => setR(parseRoute(location.hash));
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  return r;
}

function SignedOut({ message }: { message: string }) {
  return (
    <main id="main" class="signin">
      <h1>Ephemeral Sandbox console</h1>
      <p id="signin-message">{message}</p>
      <p>Run this where the gateway runs, then open the URL it prints (the code works once, for 2 minutes):</p>
      <pre class="mono">sandbox-manager-cli console</pre>
    </main>
  );
}

function App() {
  const route = useRoute();
  const [auth, setAuth] = useState<"checking" | "in" | "out">("checking");
  const [msg, setMsg] = useState("Not signed in.");
  const [notice, setNotice] = useState("");

  useEffect(() => {
    if (route.page === "login") {
      const code = route.code;
      history.replaceState(null, "", location.pathname + "#/"); // the code never stays in the URL or history
      signIn(code)
        .then(() => {
          setAuth("in");
          dispatchEvent(new HashChangeEvent("hashchange")); // the route follows the replaced URL
        })
        .catch(async (e) => {
          const m = e instanceof OpError ? `Sign-in refused: ${e.err.message}` : String(e);
          setMsg(m);
          // A browser that is signed in already stays so, and says why the code failed.
          const ok = await resume();
          setNotice(ok ? m : "");
          setAuth(ok ? "in" : "out");
          dispatchEvent(new HashChangeEvent("hashchange"));
        });
      return;
    }
    if (auth === "checking") resume().then((ok) => setAuth(ok ? "in" : "out"));
  }, [route.page === "login" ? "login:" + route.code : route.page]);

  if (auth === "checking") return <main id="main" class="signin">Signing in…</main>;
  if (auth === "out") return <SignedOut message={msg} />;

  let page;
  switch (route.page) {
    case "sandbox":
      page = <Sandbox id={route.id} />;
      break;
    case "files":
      page = <Files r={route} />;
      break;
    case "terminal":
      page = <Terminal id={route.id} ws={route.ws} />;
      break;
    case "health":
      page = <Health />;
      break;
    default:
      page = <Fleet />;
  }
  const cur = route.page;
  return (
    <>
      <a class="skip" href="#main" onClick={(e) => (e.preventDefault(), document.getElementById("main")?.focus())}>
        Skip to content
      </a>
      <header class="top">
        <a class="brand" href="#/">
          Ephemeral Sandbox
        </a>
        <nav aria-label="Pages">
          <a href={href({ page: "fleet" })} aria-current={cur === "fleet" ? "page" : undefined}>
            Fleet
          </a>
          <a href={href({ page: "health" })} aria-current={cur === "health" ? "page" : undefined}>
            Health
          </a>
        </nav>
        <button
          class="link"
          onClick={() =>
            signOut().then(() => {
              setMsg("Signed out.");
              setAuth("out");
            })
          }
        >
          Sign out
        </button>
      </header>
      <main id="main" tabIndex={-1} data-page={cur}>
        {notice && (
          <div class="error" role="alert" id="notice">
            {notice}. You are still signed in.{" "}
            <button class="link" onClick={() => setNotice("")}>
              Dismiss
            </button>
          </div>
        )}
        {page}
      </main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
