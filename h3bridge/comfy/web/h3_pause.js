// Pause / Resume for the running H3 node (issue 31). While an H3 node (H3 Generate, H3 Storyboard)
// renders, a small control shows at the bottom of the window: Pause stops the engine where it is (its
// process group is stopped; its memory stays in use, so the GPU and the CPU are free but the RAM is
// not), Resume continues it, and the clip is the one an unpaused run makes. ComfyUI's Interrupt still
// ends the job while it is paused. The server side is h3bridge/comfy/pause.py (routes on ComfyUI's
// own server); every open tab follows the state it broadcasts ("h3bridge.pause").
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const PAUSE_ROUTE = "/h3bridge/pause";
const RESUME_ROUTE = "/h3bridge/resume";
const STATE_EVENT = "h3bridge.pause";

let panel = null;
let label = null;
let button = null;
let state = { running: [], paused: false };

function build() {
  panel = document.createElement("div");
  panel.id = "h3bridge-pause";
  Object.assign(panel.style, {
    // bottom centre: clear of the minimap and the queue panel in the corners
    position: "fixed", left: "50%", transform: "translateX(-50%)", bottom: "16px", zIndex: 1000, display: "none",
    alignItems: "center",
    gap: "10px", padding: "8px 12px", borderRadius: "8px", font: "13px sans-serif",
    background: "var(--comfy-menu-bg, #353535)", color: "var(--fg-color, #fff)",
    border: "1px solid var(--border-color, #4e4e4e)", boxShadow: "0 2px 8px rgba(0,0,0,.4)",
  });
  label = document.createElement("span");
  button = document.createElement("button");
  button.className = "comfy-btn";
  Object.assign(button.style, { cursor: "pointer", padding: "4px 12px" });
  button.addEventListener("click", toggle);
  panel.append(label, button);
  document.body.append(panel);
}

function show(next) {
  state = next ?? state;
  if (!panel) build();
  const running = (state.running ?? []).length > 0;
  panel.style.display = running ? "flex" : "none";
  label.textContent = state.paused
    ? "H3 paused: the engine keeps its memory; Interrupt ends the job"
    : "H3 rendering";
  button.textContent = state.paused ? "Resume" : "Pause";
  button.title = state.paused ? "continue the engine where it stopped"
    : "stop the engine where it is (GPU and CPU freed, memory kept) until Resume";
}

async function toggle() {
  button.disabled = true;
  try {
    const response = await api.fetchApi(state.paused ? RESUME_ROUTE : PAUSE_ROUTE, { method: "POST" });
    const body = await response.json();
    if (!response.ok && body?.error) {
      console.warn(`h3bridge: ${body.error.message} (${body.error.hint})`);
    }
    show(body);
  } catch (error) {
    console.warn("h3bridge: pause/resume failed", error);
  } finally {
    button.disabled = false;
  }
}

app.registerExtension({
  name: "h3bridge.pause",
  async setup() {
    api.addEventListener(STATE_EVENT, (event) => show(event.detail));
    try {
      const response = await api.fetchApi(PAUSE_ROUTE);
      if (response.ok) show(await response.json());
    } catch (error) {
      console.warn("h3bridge: no pause control", error);
    }
  },
});
