// H3 Storyboard: a new node showed about one line of its shots box (issue 30). The frontend sizes
// a new node to its widgets' minimum heights, and next to the storyboard's ten other widgets the
// multiline shots box gets only its minimum. A new node is made taller, all of it going to the
// shots box (the only widget that grows): about eight lines, as CLIP Text Encode's box shows. A
// workflow that is loaded keeps its saved size (the frontend applies it after nodeCreated).
import { app } from "../../scripts/app.js";

export const EXTRA_HEIGHT = 120;     // px: the box goes from ~40 px to ~160 px

app.registerExtension({
  name: "h3bridge.storyboardShots",
  nodeCreated(node) {
    if (node?.comfyClass !== "H3Storyboard" || !(node.size?.length >= 2)) return;      // a Float32Array
    node.setSize([node.size[0], node.size[1] + EXTRA_HEIGHT]);
  },
});
