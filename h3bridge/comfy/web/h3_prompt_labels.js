// H3 Prompt: label each text box with its section name (Scene, Action, ...), always visible.
// ComfyUI's canvas draws a multiline box's name only as a placeholder, which disappears once the box
// has text; here the name is drawn in the box's own top padding (a CSS background), so it stays while
// typing and needs no change to ComfyUI's layout of the node.
import { app } from "../../scripts/app.js";

const LABELLED_NODES = { H3Prompt: ["scene", "action", "camera", "look", "audio", "free_text"] };

function labelImage(text) {
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="200" height="14">` +
    `<text x="2" y="11" font-family="sans-serif" font-size="10" font-weight="bold" fill="#8a8a8a">${text}</text></svg>`;
  return `url("data:image/svg+xml;utf8,${encodeURIComponent(svg)}")`;
}

function labelBox(widget) {
  const box = widget.element ?? widget.inputEl;
  if (!(box instanceof HTMLTextAreaElement)) return;
  const label = widget.label ?? widget.name;
  box.style.backgroundImage = labelImage(label.replace("_", " "));
  box.style.backgroundRepeat = "no-repeat";
  box.style.backgroundPosition = "4px 2px";
  box.style.backgroundAttachment = "local";   // scrolls away with the text, never under it
  box.style.paddingTop = "16px";
  box.dataset.h3Label = label;
}

app.registerExtension({
  name: "h3bridge.promptLabels",
  nodeCreated(node) {
    const names = LABELLED_NODES[node.comfyClass];
    if (!names) return;
    for (const widget of node.widgets ?? []) {
      if (names.includes(widget.name)) labelBox(widget);
    }
  },
});
