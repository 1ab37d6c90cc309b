// The SDK's WebRTC transport, exactly as npm ships it, for page.html.
export { OpenAIRealtimeWebRTC } from "@openai/agents-realtime";
