// H3 Storyboard: workflows saved before its seed lost "control after generate" (issue 20 item 1).
// The frontend gave every INT input named `seed` that widget (default "randomize"), so each Run sent
// a new story seed and rendered every shot again; the node now declares control_after_generate=false.
// Widget values are saved by position, so a workflow saved with the control's value ("randomize",
// after the seed) would shift crossfade_frames and job_name by one: drop that value on load.
import { app } from "../../scripts/app.js";

const CONTROL_VALUES = ["fixed", "increment", "decrement", "randomize"];
const SEED_INDEX = 4;        // shots, preset, width, height, seed, [control], crossfade_frames, job_name[, ssd_streaming, force]

export function dropStoryboardSeedControl(graph) {
  const graphs = [graph, ...(graph?.definitions?.subgraphs ?? [])];
  for (const nodes of graphs.map((g) => g?.nodes ?? [])) {
    for (const node of nodes) {
      const values = node?.widgets_values;
      if (node?.type === "H3Storyboard" && Array.isArray(values) && values.length >= 8
          && CONTROL_VALUES.includes(values[SEED_INDEX + 1])) {
        values.splice(SEED_INDEX + 1, 1);
      }
    }
  }
}

app.registerExtension({
  name: "h3bridge.storyboardSeed",
  beforeConfigureGraph(graph) {
    dropStoryboardSeedControl(graph);
  },
});
