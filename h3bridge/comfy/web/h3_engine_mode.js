// H3 nodes in the frontend (issue 30):
// 1. The engine modes are the vocabulary's (one-shot, session, library, remote). A workflow saved
//    with the old name "warm session" is rewritten to "session" when it loads (a dynamic combo's
//    value must be one of its options, or the frontend shows none of that mode's inputs), and the
//    user is told once.
// 2. What ComfyUI's input validation found wrong (the H3 nodes' validate_inputs: the missing
//    engine, the missing model and its download command) is written on the node itself, once per
//    message, not only "H3 Model rejected the value for model" in a toast.
// 3. The inputs under a mode, preset or length choice carry their English tooltip from the node
//    definition, which the frontend prefers to the locale's: it is dropped, so the locale's text
//    (locales/<lang>/nodeDefs.json, `mode_model_dir`, `length_unit_seconds`, ...) is shown.
// 4. The frontend translates no combo option: the H3 combos show the labels of main.json's
//    `h3bridge.options` in the chosen language (the value sent stays the option itself).
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

let packTexts = null;      // {lang: {options, messages}} from ComfyUI's /i18n (our locales/*/main.json)

async function loadPackTexts() {
  try {
    const response = await api.fetchApi("/i18n");
    const all = await response.json();
    packTexts = Object.fromEntries(Object.entries(all).map(([lang, texts]) => [lang, texts?.h3bridge ?? {}]));
  } catch (error) {
    console.warn("h3bridge: no translated option labels", error);
    packTexts = {};
  }
}

function locale() {
  const chosen = app.extensionManager?.setting?.get?.("Comfy.Locale") ?? "en";
  return packTexts?.[chosen] ? chosen : String(chosen).split("-")[0];
}

function packText(kind, key) {
  return packTexts?.[locale()]?.[kind]?.[key] ?? packTexts?.en?.[kind]?.[key];
}

function labelOptions(node) {
  for (const widget of node.widgets ?? []) {
    if (widget.type !== "combo" || widget.options?.getOptionLabel) continue;
    const where = `${node.comfyClass ?? node.type}/${String(widget.name).replaceAll(".", "_")}`;
    if (!packText("options", where)) continue;
    widget.options.getOptionLabel = (value) => packText("options", where)?.[value] ?? value;
  }
}

// Where each engine node saves its mode among its widget values (V2: the dynamic combo first; the
// deprecated node: engine_path, model_dir, mode, ...). Only that value is renamed.
const MODE_INDEX = { H3EngineV2: 0, H3Engine: 2 };
const OLD_MODES = { "warm session": "session", "warm-session": "session", "warm_session": "session",
                    "cli": "one-shot", "oneshot": "one-shot", "one_shot": "one-shot" };

export function renameOldEngineModes(graph) {
  const renamed = [];
  const graphs = [graph, ...(graph?.definitions?.subgraphs ?? [])];
  for (const nodes of graphs.map((g) => g?.nodes ?? [])) {
    for (const node of nodes) {
      const values = node?.widgets_values;
      const index = MODE_INDEX[node?.type];
      if (index === undefined || !Array.isArray(values)) continue;
      const value = values[index];
      if (typeof value === "string" && Object.hasOwn(OLD_MODES, value)) {
        values[index] = OLD_MODES[value];
        renamed.push(`${value} -> ${OLD_MODES[value]}`);
      }
    }
  }
  return renamed;
}

// "mode.model_dir - <message>" (execution.py) -> "<message>", each message once.
export function validationMessages(nodeErrors) {
  const messages = [];
  for (const error of nodeErrors?.errors ?? []) {
    const details = String(error?.details ?? "");
    const cut = details.indexOf(" - ");
    const text = cut >= 0 ? details.slice(cut + 3) : (details || error?.message || "");
    if (text && !messages.includes(text)) messages.push(text);
  }
  return messages;
}

function wrap(ctx, text, width) {
  const lines = [];
  for (const paragraph of text.split("\n")) {
    let line = "";
    for (const word of paragraph.split(" ")) {
      const next = line ? `${line} ${word}` : word;
      if (line && ctx.measureText(next).width > width) {
        lines.push(line);
        line = word;
      } else {
        line = next;
      }
    }
    lines.push(line);
  }
  return lines;
}

// The inputs a message leads with ("1. engine_path: ...", "model_dir: ...", problems_text in adapter.py).
export function namedInputs(messages) {
  const names = new Set();
  for (const message of messages) {
    for (const match of message.matchAll(/(?:^|\n)(?:\d+\. )?([a-z_0-9]+): /g)) names.add(match[1]);
  }
  return names;
}

function errorsOf(node) {
  return validationMessages(app.lastNodeErrors?.[String(node.id)]);
}

function outlineNamedWidgets(node, ctx) {
  const names = namedInputs(errorsOf(node));
  if (!names.size) return;
  ctx.save();
  ctx.strokeStyle = "#ff3030";
  ctx.lineWidth = 2;
  for (const widget of node.widgets ?? []) {
    const name = String(widget.name).split(".").pop();
    if (!names.has(name) || widget.last_y === undefined) continue;
    const height = widget.computedHeight ?? widget.computeSize?.(node.size[0])?.[1] ?? 20;
    ctx.strokeRect(10, widget.last_y, node.size[0] - 20, height);
  }
  ctx.restore();
}

function drawMessages(node, ctx) {
  if (!String(node.comfyClass ?? node.type).startsWith("H3") || node.flags?.collapsed) return;
  const messages = errorsOf(node);
  if (!messages.length) return;
  ctx.save();
  ctx.font = "12px sans-serif";
  const width = Math.max(node.size[0], 320) - 8;
  const lines = messages.flatMap((message) => wrap(ctx, message, width));
  const left = node.pos[0], top = node.pos[1] + node.size[1] + 8;
  ctx.fillStyle = "rgba(60, 0, 0, 0.92)";
  ctx.fillRect(left, top, width + 8, lines.length * 15 + 8);
  ctx.fillStyle = "#ffb0b0";
  lines.forEach((line, index) => ctx.fillText(line, left + 4, top + 15 + index * 15));
  ctx.restore();
}

// The frontend's own toast says only "A node rejected one or more input values": the H3 nodes'
// messages (what is missing and the command that fixes it) are toasted too, once per refusal.
let toasted = null;
function toastNewErrors() {
  const errors = app.lastNodeErrors;
  if (errors === toasted) return;
  toasted = errors;
  for (const node of app.graph?._nodes ?? []) {
    if (!String(node.comfyClass ?? node.type).startsWith("H3")) continue;
    const messages = errorsOf(node);
    if (messages.length) {
      app.extensionManager?.toast?.add?.({ severity: "error", summary: node.title, detail: messages.join("\n\n") });
    }
  }
}

function isH3Node(nodeData) {
  return String(nodeData?.category ?? "").startsWith("MiniMax-H3");
}

app.registerExtension({
  name: "h3bridge.engineModeAndValidation",
  beforeConfigureGraph(graph) {
    const renamed = renameOldEngineModes(graph);
    if (renamed.length) {
      const template = packText("messages", "old_mode_renamed")
        ?? "H3 Engine: mode {0} (the new name of the same mode; save the workflow to keep it)";
      const text = template.replace("{0}", [...new Set(renamed)].join(", "));
      console.info(text);
      app.extensionManager?.toast?.add?.({ severity: "info", summary: "H3 Engine", detail: text, life: 8000 });
    }
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!isH3Node(nodeData)) return;
    const draw = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx, ...rest) {
      const result = draw?.apply(this, [ctx, ...rest]);
      if (packTexts) labelOptions(this);
      for (const widget of this.widgets ?? []) {
        // a dynamic choice's input (mode.model_dir, length_unit.seconds): the locale's tooltip
        if (widget.name?.includes(".") && widget.tooltip) delete widget.tooltip;
      }
      outlineNamedWidgets(this, ctx);
      return result;
    };
  },
  async setup() {
    await loadPackTexts();
    // The messages are drawn over the canvas, after every node, so a node below does not hide them.
    const canvas = app.canvas;
    const drawForeground = canvas.onDrawForeground;
    canvas.onDrawForeground = function (ctx, area) {
      drawForeground?.apply(this, [ctx, area]);
      for (const node of app.graph?._nodes ?? []) drawMessages(node, ctx);
      toastNewErrors();
    };
  },
});
